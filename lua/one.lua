-- Entry for one request of one policy that neither takes overrides nor bans: the protocol of
-- protocol.lua, read at fixed places, so the lean script builds no table. Reply, packed (see
-- packed in prelude.lua): allowed
-- (1/0), remaining, reset (ms), retry (ms), then for a reservation the time it was taken at
-- (us; 0 for a retry, which took nothing).
local limit, window, burst = number(ARGV[5]), number(ARGV[6]), number(ARGV[7])
-- Delay mode: the longest delay (ms) follows the policy's flags, and the request follows it.
local slack, a = nil, 9
if number(ARGV[8]) % (2 * DELAY) >= DELAY then
  slack, a = number(ARGV[9]) * 1000, 10
end
local cost, flags = number(ARGV[a]), number(ARGV[a + 1]) % SET_STEP
local once, reserve = flags % (2 * ONCE) >= ONCE, flags % (2 * RESERVE) >= RESERVE
local key, idem = KEYS[1], nil
if once then
  idem, key = KEYS[1], KEYS[2]
  local reply = seen_before(idem)
  if reply then
    if #reply ~= (reserve and 5 or 4) then
      corrupt(idem, 'holds the reply of another request')
    end
    return packed(reply)
  end
end
local now_us = clock(ARGV[1])
local allowed, remaining, reset, retry = alone(key, limit, window, burst, now_us, cost, nil, slack)
flush_writes()
local reply = { allowed, remaining, reset, retry }
if reserve then
  reply[5] = 0
end
if idem then
  remember(idem, reply, 1, #reply, ARGV[a + 2])
end
if reserve then
  reply[5] = now_us
end
return packed(reply)
