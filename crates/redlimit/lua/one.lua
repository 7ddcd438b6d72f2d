-- Entry for one policy. KEYS[1]: its key, then optionally an idempotency key (see
-- seen_before). ARGV: now (see clock), cost (0 peeks), then the policy's algorithm tag, limit,
-- window (ms) and burst. Reply: allowed (1/0), remaining, reset (ms), retry (ms).
local key, cost, idem = KEYS[1], tonumber(ARGV[2]), KEYS[2]
if idem then
  local reply = seen_before(idem)
  if reply then
    return reply
  end
end
local limit, window, burst = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local now_us = clock()
local allowed, remaining, reset, retry, a, b, c, d = decide(key, limit, window, burst, now_us, cost)
if allowed == 1 and cost > 0 then
  remaining, reset = take(key, limit, window, burst, now_us, cost, a, b, c, d)
end
local reply = { allowed, remaining, reset, retry }
if idem then
  remember(idem, reply, ARGV[#ARGV])
end
return reply
