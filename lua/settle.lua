-- Entry settling admitted reservations at their actual cost (see protocol.lua for the
-- arguments). A request carrying its reservation's time (TAKEN_AT) gives back its cost: each
-- algorithm's settle gives back at most the cost, only to the state the reservation counted in,
-- never below empty. A request without it charges its cost now, even past the limit, in every
-- policy of its set. A request with its reservation's request id (ONCE) moves what a retry of
-- that request is answered by as much: each admitting policy's remaining, never below 0. A
-- request with a token (GIVEN) is made only by the first call that carries it. A refund
-- (REFUND) gives back its cost to the state in force now, and replies its policies' quotas.
-- Reply, per request: how many of its policies changed; for a refund, four integers per policy
-- (as check.lua's for a check of cost 0) after it.
local sets, a = read_sets(ARGV)
-- How long (ms) a settle's token is kept: far longer than the settle is sent again for.
local GIVEN_TTL_MS = 600000
local now_us, out, k, last, _ = clock(ARGV[1]), {}, 1, #ARGV, nil

-- The reply remembered at idem (stored, as read before the settle) for a request of policies
-- policies, each admitting policy's remaining moved by delta.
local function resettle(idem, stored, policies, delta)
  if not stored or #stored < 4 * policies then
    return
  end
  for i = 1, policies do
    local at = 4 * (i - 1)
    if stored[at + 1] == 1 then
      stored[at + 2] = math.max(0, stored[at + 2] + delta)
    end
  end
  remember(idem, stored, 1, #stored, nil)
end

-- What the call kept to its end (GCRA's and the token bucket's writes) is written even where a
-- request fails (its state corrupt): the requests settled before it stand, as their tokens do,
-- so a settle sent again is not made twice and none made is lost. One pcall per call.
local function settle_requests()
  while a <= last do
    local cost, set, once, taken_at, repeats, given, refund
    cost, set, _, once, taken_at, a, repeats, _, given, _, refund = read_request(ARGV, a)
    if refund then
      taken_at = now_us
    end
    for _ = 1, repeats do
      local idem
      if once then
        idem, k = KEYS[k], k + 1
      end
      -- A request is settled whole or not at all: its request id's reply and its policies'
      -- states are read first (decide writes nothing), so that corrupt state stops it before a
      -- policy changes or its token is set, and the settle sent again once the state is
      -- repaired is made once. The first policy's own settle reads it before any write, but
      -- for a token set before it.
      local stored = idem and seen_before(idem)
      local policies = sets[set]
      if #policies > 1 or given then
        local at = given and k + 1 or k
        for i, p in ipairs(policies) do
          -- The first's override is read only where its state is (skip: its keys passed).
          local read = i > 1 or given
          local key, limit, window, burst
          key, limit, window, burst, _, _, at = policy_keys(p, KEYS, at, not read)
          if read then
            p.decide(key, limit, window, burst, now_us, 0)
          end
        end
      end
      -- Sent again after its answer was lost, a settle made by a token finds it set, and
      -- changes nothing.
      local first = true
      if given then
        first = redis_call('SET', KEYS[k], '1', 'NX', 'PX', GIVEN_TTL_MS) ~= false
        k = k + 1
      end
      local changed = 0
      for _, p in ipairs(policies) do
        local key, limit, window, burst
        key, limit, window, burst, _, _, k = policy_keys(p, KEYS, k)
        if first and refund and p.refund then
          changed = changed + p.refund(key, limit, window, burst, now_us, cost)
        elseif first then
          changed = changed + p.settle(key, limit, window, burst, now_us, cost, taken_at)
        end
        if refund then
          local n = #out
          out[n + 1], out[n + 2], out[n + 3], out[n + 4] = p.decide(key, limit, window, burst, now_us, 0, p.slack)
        end
      end
      if idem and first then
        resettle(idem, stored, #policies, taken_at and cost or -cost)
      end
      if not refund then
        out[#out + 1] = changed
      end
    end
  end
end

local ok, err = pcall(settle_requests)
flush_writes()
flush_groups()
if not ok then
  raise(err)
end
return out
