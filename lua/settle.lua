-- Entry settling admitted reservations at their actual cost (see protocol.lua for the
-- arguments). A request carrying its reservation's time (TAKEN_AT) gives back its cost: each
-- algorithm's settle gives back at most the cost, only to the state the reservation counted in,
-- never below empty. A request without it charges its cost now, even past the limit, in every
-- policy of its set. Reply, per request: how many of its policies changed.
local sets, a = read_sets(ARGV)
local now_us, out, k, last, _ = clock(ARGV[1]), {}, 1, #ARGV, nil
while a <= last do
  local cost, set, taken_at, repeats
  cost, set, _, _, taken_at, a, repeats = read_request(ARGV, a)
  for _ = 1, repeats do
    local changed = 0
    for _, p in ipairs(sets[set]) do
      local key, limit, window, burst
      key, limit, window, burst, _, _, k = policy_keys(p, KEYS, k)
      changed = changed + p.settle(key, limit, window, burst, now_us, cost, taken_at)
    end
    out[#out + 1] = changed
  end
end
return out
