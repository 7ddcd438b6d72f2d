-- Entry for any requests of any policies, decided in order at one time (see protocol.lua for
-- the arguments). Reply, per request: four integers per policy (as one.lua's; a ban's denial
-- replies allowed = 2), then the limit in force of each policy that takes overrides, then for
-- a reservation the time it was taken at (us; 0 for a retry). A request consumes nothing
-- unless every one of its policies admits; then each one's reply is its quota after the
-- request, otherwise before it. A banned client is denied until its ban ends, and every denial
-- by a policy that bans counts towards a ban.

local now_us, _ = nil, nil
-- out: every request's reply; the first request's own, so a lone request copies nothing.
local out, a, k = nil, 3, 1
for _ = 1, tonumber(ARGV[2]) do
  local cost, count, reserve, once_window
  cost, count, reserve, once_window, _, a = read_header(ARGV, a)
  local idem, reply = nil, nil
  if once_window then
    idem = KEYS[k]
    k = k + 1
    reply = seen_before(idem)
  end
  if reply then
    local length = 4 * count + (reserve and 1 or 0)
    for _ = 1, count do
      local overridable
      _, _, _, _, _, overridable, _, _, _, _, a, k = read_policy(ARGV, KEYS, a, k, true)
      if overridable then
        length = length + 1
      end
    end
    -- A reply of another shape would misalign every later request's in a batch.
    if #reply ~= length then
      corrupt(idem, 'holds the reply of another request')
    end
  else
    now_us = now_us or clock(ARGV[1])
    -- limits: the limit in force of each policy that takes overrides, made at the first.
    local kept, admitted, limits = {}, true, nil
    reply = {}
    for i = 1, count do
      local name, key, limit, window, burst, overridable, ban, skey, bkey, slack
      name, key, limit, window, burst, overridable, ban, skey, bkey, slack, a, k = read_policy(ARGV, KEYS, a, k)
      if overridable then
        limits = limits or {}
        limits[#limits + 1] = limit
      end
      local decide, take = algorithm(name)
      local allowed, remaining, reset, retry, b, c, d, e
      local left = nil
      if ban then
        left = marks_of().banned(bkey, div(now_us, 1000))
      end
      if left then
        allowed, remaining, reset, retry = 2, 0, left, left
      else
        allowed, remaining, reset, retry, b, c, d, e = decide(key, limit, window, burst, now_us, cost, slack)
        if allowed == 0 and ban and retry ~= NEVER then
          local length = marks_of().strike(skey, bkey, ban, div(now_us, 1000))
          if length then
            allowed, reset, retry = 2, max(reset, length), length
          end
        end
      end
      reply[4 * i - 3], reply[4 * i - 2], reply[4 * i - 1], reply[4 * i] = allowed, remaining, reset, retry
      kept[i] = { take, key, limit, window, burst, b, c, d, e }
      if allowed ~= 1 then
        admitted = false
      end
    end
    if admitted and cost > 0 then
      for i = 1, count do
        local t = kept[i]
        reply[4 * i - 2], reply[4 * i - 1] = t[1](t[2], t[3], t[4], t[5], now_us, cost, t[6], t[7], t[8], t[9])
      end
    end
    for i = 1, limits and #limits or 0 do
      reply[#reply + 1] = limits[i]
    end
    if reserve then
      reply[#reply + 1] = 0
    end
    if idem then
      remember(idem, reply, once_window)
    end
    if reserve then
      reply[#reply] = now_us
    end
  end
  if out == nil then
    out = reply
  else
    for i = 1, #reply do
      out[#out + 1] = reply[i]
    end
  end
end
return out
