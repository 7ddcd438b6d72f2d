-- What a policy's flags may ask of the scripts that check several policies or refund:
-- overrides and bans. Kept out of the prelude so that the lean script of one policy has none of
-- it, and built on first use, so that a check of policies without them creates none of its
-- functions.

local marks = nil

local function load_marks()
  local m = {}
  -- Bans: a policy that bans keeps two keys per client, its denials within the last 'within' ms
  -- (a string counter, expiring 'within' after the first) and its ban (a hash: u = banned until,
  -- in ms; n = bans so far, remembered for 'max' ms after a ban ends when bans escalate).
  -- The ms until the client's ban ends, or nil when it is not banned.
  function m.banned(bkey, now)
    local until_ms = int(bkey, redis_call('HGET', bkey, 'u'))
    if until_ms and until_ms > now then
      return until_ms - now
    end
    return nil
  end

  -- Counts a denial; when it is more than 'after' within 'within', starts a ban ('for', doubled
  -- on each repeat up to 'max' when max > 0) and returns its length in ms.
  function m.strike(skey, bkey, ban, now)
    local after, within, length, most = ban[1], ban[2], ban[3], ban[4]
    local strikes = redis_call('INCR', skey)
    if strikes == 1 then
      redis_call('PEXPIRE', skey, within)
    end
    if strikes <= after then
      return nil
    end
    redis_call('DEL', skey)
    local n = redis_call('HINCRBY', bkey, 'n', 1)
    if most > 0 then
      -- Doubling stops at max; past 2^40 the double would lose exactness.
      length = min(length * 2 ^ min(n - 1, 40), most)
    end
    redis_call('HSET', bkey, 'u', str(now + length))
    redis_call('PEXPIRE', bkey, length + most)
    return length
  end

  -- Per-client overrides: the key at okey, when present, holds 'limit,window,burst,key', other
  -- numbers for this client and the key its state lives under with them (in the client's slot).
  -- The counter key and numbers to check by.
  function m.overridden(okey, key, limit, window, burst)
    local stored = redis_call('GET', okey)
    if not stored then
      return key, limit, window, burst
    end
    local l, w, b, k = match(stored, '^(%d+),(%d+),(%d+),(.+)$')
    if not k then
      corrupt(okey, 'is not an override')
    end
    return k, l + 0, w + 0, b + 0
  end

  return m
end

-- The marks' functions, made at their first use in a call.
local function marks_of()
  marks = marks or load_marks()
  return marks
end
