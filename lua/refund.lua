-- Entry giving back what admitted reservations took, for responses that should not count (see
-- protocol.lua for the arguments: each request carries its reservation's time, TAKEN_AT). Each
-- algorithm's refund gives back at most the cost, only to the state the reservation counted in,
-- never below empty. Reply, per request: how many of its policies gave something back.
local now_us = clock(ARGV[1])
local out, a, k = {}, 3, 1
for r = 1, tonumber(ARGV[2]) do
  local request
  request, a, k = read_request(ARGV, KEYS, a, k)
  local refunded = 0
  for _, p in ipairs(request.policies) do
    local key, limit, window, burst = in_force(p)
    local _, _, refund = algorithm(p.algorithm)
    refunded = refunded + refund(key, limit, window, burst, now_us, request.cost, request.taken_at)
  end
  out[r] = refunded
end
return out
