-- Entry for one request of one policy that neither takes overrides nor bans: the protocol of
-- protocol.lua, read at fixed places, so the lean script builds no table. Reply: allowed
-- (1/0), remaining, reset (ms), retry (ms), then for a reservation the time it was taken at
-- (us; 0 for a retry, which took nothing).
local cost, flags, a = tonumber(ARGV[3]), tonumber(ARGV[5]), 6
local once, reserve = flags % (2 * ONCE) >= ONCE, flags % (2 * RESERVE) >= RESERVE
local key, idem, window_once = KEYS[1], nil, nil
if once then
  idem, key, window_once = KEYS[1], KEYS[2], ARGV[a]
  a = a + 1
  local reply = seen_before(idem)
  if reply then
    if #reply ~= (reserve and 5 or 4) then
      corrupt(idem, 'holds the reply of another request')
    end
    return reply
  end
end
local limit, window, burst = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
-- Delay mode: the longest delay (ms) follows the policy's flags.
local slack = nil
if tonumber(ARGV[a + 4]) % (2 * DELAY) >= DELAY then
  slack = tonumber(ARGV[a + 5]) * 1000
end
local now_us = clock(ARGV[1])
local allowed, remaining, reset, retry, b, c, d, e = decide(key, limit, window, burst, now_us, cost, slack)
if allowed == 1 and cost > 0 then
  remaining, reset = take(key, limit, window, burst, now_us, cost, b, c, d, e)
end
local reply = { allowed, remaining, reset, retry }
if reserve then
  reply[5] = 0
end
if idem then
  remember(idem, reply, 1, #reply, window_once)
end
if reserve then
  reply[5] = now_us
end
return reply
