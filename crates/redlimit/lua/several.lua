-- Entry for several policies, all under one hash tag. KEYS: one key per policy, then for each
-- policy in order its override key if it takes overrides (see overridden) and its strikes and
-- ban keys if it bans (see strike), then optionally an idempotency key (see seen_before).
-- ARGV: now (see clock), cost (0 peeks), then four per policy: algorithm tag (with its marks,
-- see marks.lua), limit, window (ms), burst; then optionally the idempotency window, then
-- optionally 'r' for a reservation (refund.lua may give it back).
-- Reply: four integers per policy, as one.lua; then the limit in force for each policy that
-- takes overrides; then for a reservation the time it was taken at (us; 0 for a retry). Nothing is consumed
-- unless every policy admits; then each one's reply is its quota after the check, otherwise
-- before it. A banned client is denied until its ban ends, and every denial by a policy that
-- bans counts towards a ban.

local cost = tonumber(ARGV[2])
local reserve = ARGV[#ARGV] == 'r'
-- Four arguments a policy; the extras add one or two, which the division drops.
local policies = div(#ARGV - 2, 4)
local extras = #ARGV - 2 - 4 * policies
local idem = nil
if extras == 2 or (extras == 1 and not reserve) then
  idem = KEYS[#KEYS]
  local seen = seen_before(idem)
  if seen then
    return seen
  end
end
local now_us = clock()
-- limits: the limit in force of each policy that takes overrides, made at the first.
local reply, kept, admitted, limits = {}, {}, true, nil
-- The last of the extra keys taken.
local cursor = policies
for i = 1, policies do
  local at = 2 + (i - 1) * 4
  local key, limit, window, burst = KEYS[i], tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4])
  local tag, overridable, ban, m = policy_tag(ARGV[at + 1])
  if overridable then
    cursor = cursor + 1
    key, limit, window, burst = m.overridden(KEYS[cursor], key, limit, window, burst)
    limits = limits or {}
    limits[#limits + 1] = limit
  end
  local decide, take = algorithm(tag)
  local allowed, remaining, reset, retry, a, b, c, d
  local left, skey, bkey = nil, nil, nil
  if ban then
    skey, bkey = KEYS[cursor + 1], KEYS[cursor + 2]
    cursor = cursor + 2
    left = m.banned(bkey, div(now_us, 1000))
  end
  -- A ban's denial replies allowed = 2.
  if left then
    allowed, remaining, reset, retry = 2, 0, left, left
  else
    allowed, remaining, reset, retry, a, b, c, d = decide(key, limit, window, burst, now_us, cost)
    if allowed == 0 and ban and retry ~= NEVER then
      local length = m.strike(skey, bkey, ban, div(now_us, 1000))
      if length then
        allowed, reset, retry = 2, max(reset, length), length
      end
    end
  end
  reply[#reply + 1] = allowed
  reply[#reply + 1] = remaining
  reply[#reply + 1] = reset
  reply[#reply + 1] = retry
  kept[i] = { take, key, limit, window, burst, a, b, c, d }
  if allowed ~= 1 then
    admitted = false
  end
end
if admitted and cost > 0 then
  for i = 1, policies do
    local k = kept[i]
    reply[4 * i - 2], reply[4 * i - 1] =
      k[1](k[2], k[3], k[4], k[5], now_us, cost, k[6], k[7], k[8], k[9])
  end
end
for i = 1, limits and #limits or 0 do
  reply[#reply + 1] = limits[i]
end
if reserve then
  reply[#reply + 1] = now_us
end
if idem then
  -- A retry takes nothing: the time it answers is 0, so it is never refunded.
  if reserve then
    reply[#reply] = 0
  end
  remember(idem, reply, ARGV[3 + 4 * policies])
  if reserve then
    reply[#reply] = now_us
  end
end
return reply
