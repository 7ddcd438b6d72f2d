-- Entry giving back what admitted reservations took, for responses that should not count (see
-- protocol.lua for the arguments: each request carries its reservation's time, TAKEN_AT). Each
-- algorithm's refund gives back at most the cost, only to the state the reservation counted in,
-- never below empty. Reply, per request: how many of its policies gave something back.
local sets, a = read_sets(ARGV)
local now_us, out, k, last, _ = clock(ARGV[1]), {}, 1, #ARGV, nil
while a <= last do
  local cost, set, taken_at
  cost, set, _, _, taken_at, a = read_request(ARGV, a)
  local refunded = 0
  for _, p in ipairs(sets[set]) do
    local key, limit, window, burst
    key, limit, window, burst, _, _, k = policy_keys(p, KEYS, k)
    refunded = refunded + p.refund(key, limit, window, burst, now_us, cost, taken_at)
  end
  out[#out + 1] = refunded
end
return out
