-- Entry giving back what admitted reservations took, for responses that should not count (see
-- protocol.lua for the arguments: each request carries its reservation's time, TAKEN_AT). Each
-- algorithm's refund gives back at most the cost, only to the state the reservation counted in,
-- never below empty. Reply, per request: how many of its policies gave something back.
local now_us, _ = clock(ARGV[1]), nil
local out, a, k = {}, 3, 1
for r = 1, tonumber(ARGV[2]) do
  local cost, count, taken_at
  cost, count, _, _, taken_at, a = read_header(ARGV, a)
  local refunded = 0
  for _ = 1, count do
    local name, key, limit, window, burst
    name, key, limit, window, burst, _, _, _, _, _, a, k = read_policy(ARGV, KEYS, a, k)
    local _, _, refund = algorithm(name)
    refunded = refunded + refund(key, limit, window, burst, now_us, cost, taken_at)
  end
  out[r] = refunded
end
return out
