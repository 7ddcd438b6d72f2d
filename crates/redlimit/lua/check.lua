-- Entry point. KEYS: one key per policy, all under one hash tag.
-- ARGV[1]: now in microseconds, or '' to read Redis TIME. ARGV[2]: cost (0 peeks).
-- Then four per policy: algorithm tag, limit, window (ms), burst.
-- Reply: four integers per policy: allowed (1/0), remaining, reset (ms), retry (ms; -1 when
-- allowed, -2 when the cost can never pass). Nothing is consumed unless every policy admits.
local now_us
if ARGV[1] == '' then
  local time = redis.call('TIME')
  now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
else
  now_us = tonumber(ARGV[1])
end
local cost = tonumber(ARGV[2])

local plans, admitted = {}, true
for i = 1, #KEYS do
  local base = 2 + (i - 1) * 4
  local algorithm = ALGORITHMS[ARGV[base + 1]]
  local policy = {
    limit = tonumber(ARGV[base + 2]),
    window = tonumber(ARGV[base + 3]),
    burst = tonumber(ARGV[base + 4]),
  }
  plans[i] = algorithm(KEYS[i], policy, now_us, cost)
  if plans[i].denial then
    admitted = false
  end
end

local reply = {}
for i, plan in ipairs(plans) do
  local quota, allowed, retry = plan.before, 1, -1
  if plan.denial then
    allowed, retry = 0, plan.denial
  elseif admitted then
    quota = plan.after
    if cost > 0 then
      plan.write()
    end
  end
  reply[#reply + 1] = allowed
  reply[#reply + 1] = quota[1]
  reply[#reply + 1] = quota[2]
  reply[#reply + 1] = retry
end
return reply
