-- Entry for any requests of any policies, decided in order at one time (see protocol.lua for
-- the arguments). Reply, per request: four integers per policy (as one.lua's; a ban's denial
-- replies allowed = 2), then the limit in force of each policy that takes overrides, then for
-- a reservation the time it was taken at (us; 0 for a retry). A request consumes nothing
-- unless every one of its policies admits; then each one's reply is its quota after the
-- request, otherwise before it. A banned client is denied until its ban ends, and every denial
-- by a policy that bans counts towards a ban.

local now_us = nil

-- The reply to one request.
local function decide_request(request)
  if request.idem then
    local seen = seen_before(request.idem)
    if seen then
      return seen
    end
  end
  now_us = now_us or clock(ARGV[1])
  local cost, policies = request.cost, request.policies
  -- limits: the limit in force of each policy that takes overrides, made at the first.
  local reply, kept, admitted, limits = {}, {}, true, nil
  for i = 1, #policies do
    local p = policies[i]
    local key, limit, window, burst = in_force(p)
    if p.okey then
      limits = limits or {}
      limits[#limits + 1] = limit
    end
    local decide, take = algorithm(p.algorithm)
    local allowed, remaining, reset, retry, a, b, c, d
    local left = nil
    if p.ban then
      left = marks_of().banned(p.bkey, div(now_us, 1000))
    end
    if left then
      allowed, remaining, reset, retry = 2, 0, left, left
    else
      allowed, remaining, reset, retry, a, b, c, d = decide(key, limit, window, burst, now_us, cost, p.slack)
      if allowed == 0 and p.ban and retry ~= NEVER then
        local length = marks_of().strike(p.skey, p.bkey, p.ban, div(now_us, 1000))
        if length then
          allowed, reset, retry = 2, max(reset, length), length
        end
      end
    end
    local at = #reply
    reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4] = allowed, remaining, reset, retry
    kept[i] = { take, key, limit, window, burst, a, b, c, d }
    if allowed ~= 1 then
      admitted = false
    end
  end
  if admitted and cost > 0 then
    for i = 1, #policies do
      local k = kept[i]
      reply[4 * i - 2], reply[4 * i - 1] = k[1](k[2], k[3], k[4], k[5], now_us, cost, k[6], k[7], k[8], k[9])
    end
  end
  for i = 1, limits and #limits or 0 do
    reply[#reply + 1] = limits[i]
  end
  if request.reserve then
    reply[#reply + 1] = 0
  end
  if request.idem then
    remember(request.idem, reply, request.once_window)
  end
  if request.reserve then
    reply[#reply] = now_us
  end
  return reply
end

local out, a, k = {}, 3, 1
for _ = 1, tonumber(ARGV[2]) do
  local request
  request, a, k = read_request(ARGV, KEYS, a, k)
  local reply = decide_request(request)
  for i = 1, #reply do
    out[#out + 1] = reply[i]
  end
end
return out
