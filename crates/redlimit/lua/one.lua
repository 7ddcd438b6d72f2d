-- Entry for one policy. KEYS[1]: its key. ARGV: now (see clock), cost (0 peeks), then the
-- policy's algorithm tag, limit, window (ms) and burst. Reply: allowed (1/0), remaining,
-- reset (ms), retry (ms).
local key, cost = KEYS[1], tonumber(ARGV[2])
local limit, window, burst = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local now_us = clock()
local allowed, remaining, reset, retry, a, b, c, d = decide(key, limit, window, burst, now_us, cost)
if allowed == 1 and cost > 0 then
  remaining, reset = take(key, limit, window, burst, now_us, cost, a, b, c, d)
end
return { allowed, remaining, reset, retry }
