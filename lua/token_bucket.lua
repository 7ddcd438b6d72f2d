-- Token bucket (tb): a string of two big-endian 8-byte integers (16 bytes), the tokens taken
-- multiplied by the window (ms), and the last refill (ms); the text 'used:last' versions before
-- kept is read alike and rewritten in this form by the next admission. Packed rather than text:
-- struct reads it in one call, where a pattern and two conversions read the text, and writes
-- it without formatting a text per state (Redis instructions per decision, uniform / Zipf keys:
-- see the bench's README). limit tokens per window refill it, burst tokens fill it. What was taken,
-- not what is left, is kept, so the state means the same under any limit or burst: a raised
-- burst has room for the difference at once, a lowered one waits for what was taken beyond it.
-- One string (GET, then SET ... PX; or SET ... NX GET alone, see token_bucket_alone) rather than
-- a hash (HMGET, HSET, PEXPIRE): a command less per admission.
-- Made by token_bucket_functions when a call first checks a policy of it (dispatch.lua), so a call
-- makes the functions of the algorithms it checks, not every algorithm's: a table of
-- them by name (see the prelude).
-- A bucket's answer to a request of cost where it does not take: its tokens taken (x window)
-- used, refills counting from now + lag. allowed, remaining, reset (ms) and retry (ms); shared
-- by a key's buckets and a key group's (groups.lua).
local function bucket_answer(used, lag, rate, window, burst, cost)
  local room, needed = burst * window - used, cost * window
  local remaining, reset = div(max(room, 0), window), lag + ceil_div(used, rate)
  if cost > burst then
    return 0, remaining, reset, NEVER
  elseif needed > room then
    return 0, remaining, reset, lag + ceil_div(needed - room, rate)
  end
  return 1, remaining, reset, -1
end

local function token_bucket_functions(call)
  -- Over Redis, or over a key group's records (groups.lua) when given its calls.
  local redis_call = call or redis_call
  -- What this call wrote at each key: the tokens taken (false where it deleted the key) and
  -- the last refill. A script runs alone and its keys do not expire while it runs, so a client
  -- checked again in the same call (a hot one) is read from here, not from Redis: one command a
  -- decision, its write, where the other read and wrote. Redis instructions per decision,
  -- uniform / Zipf keys, measured as the SET NX GET below: 24,333 / 30,372 -> 25,672 / 27,958
  -- (a table entry per client costs where clients do not repeat, and saves a read where they
  -- do).
  local wrote_used, wrote_last = write_caches(call)
  -- A call's start, where these functions outlive the call (library.lua): what the last call
  -- wrote is Redis's now, read from there.
  local write, flush, forget = nil, nil, nil
  local function token_bucket_fresh()
    if next(wrote_used) then
      wrote_used, wrote_last = write_caches(call)
      forget()
    end
  end

  -- The tokens taken (x window) and the last refill stored in v, the value at key.
  local function bucket_state(key, v)
    local used, last = pair_of(v)
    if not used then
      corrupt(key, 'is not a token bucket')
    end
    return used, last
  end

  -- The tokens taken (x window) at now, and the time refills count from; from v, the key's
  -- value (read when this call has not written it and v is nil).
  local function bucket_now(key, rate, now, v)
    local used, last = wrote_used[key], wrote_last[key]
    if used == nil then
      v = v or redis_call('GET', key)
      if not v then
        return 0, now
      end
      used, last = bucket_state(key, v)
    elseif not used then
      return 0, now
    end
    if last >= now then
      return used, last
    elseif now - last >= ceil_div(used, rate) then
      return 0, now
    end
    return used - (now - last) * rate, now
  end

  local ttls = texts()
  write, flush, forget = pair_writes(call, ttls)
  -- The state a first admission writes, its tokens and time, packed.
  local first_packed = packer()
  -- A first admission's tokens taken (x window), TTL (ms) and quota after it, for the last
  -- rate, window, burst and cost asked: a call's checks mostly share them, so they are worked
  -- out once, not by two divisions a check. Redis instructions per decision, uniform / Zipf
  -- keys, two interleaved pairs of `redlimit-bench --mode instructions --decisions 40000
  -- --only token_bucket`: 24,520 / 23,078 -> 23,272 / 22,162 and 24,487 / 22,997 -> 23,107 /
  -- 22,179 (GCRA's alike bought 1.7% / 0.4%, and was not kept).
  local at_rate, at_window, at_burst, at_cost, first_needed, first_reset, first_remaining =
    nil, nil, nil, nil, nil, nil, nil

  local function token_bucket_take(key, rate, window, burst, now_us, cost, used, last, lag)
    local reset = lag + ceil_div(used, rate)
    if reset > 0 then
      write(key, used, last, reset)
      wrote_used[key], wrote_last[key] = used, last
    else
      -- Nothing taken: a full bucket, as an absent key is.
      write(key, nil, nil, false)
      wrote_used[key] = false
    end
    return div(max(burst * window - used, 0), window), reset
  end

  -- Instructions per decision against decide then take, 64 per call on 10,000 keys:
  -- 36,553 -> 33,302.
  local function token_bucket_alone(key, rate, window, burst, now_us, cost, _, _, only_decide)
    local now = ms_of(now_us)
    local v = nil
    if cost > 0 and cost <= burst and not only_decide and wrote_used[key] == nil then
      -- An absent key is a full bucket (its TTL ends when the bucket refills), so the admission
      -- it must then be is written by the read itself, the key set only where it is absent:
      -- one command of state, not two, for a client back within its rate. Redis instructions
      -- per decision, uniform / Zipf keys (`redlimit-bench --mode instructions --decisions
      -- 40000`): 30,397 / 33,320 -> 24,333 / 30,372.
      if rate ~= at_rate or window ~= at_window or burst ~= at_burst or cost ~= at_cost then
        at_rate, at_window, at_burst, at_cost = rate, window, burst, cost
        first_needed = cost * window
        first_reset = ceil_div(first_needed, rate)
        first_remaining = div(burst * window - first_needed, window)
      end
      v = redis_call('SET', key, first_packed(first_needed, now), 'NX', 'GET', 'PX', ttls[first_reset])
      if not v then
        wrote_used[key], wrote_last[key] = first_needed, now
        return 1, first_remaining, first_reset, -1
      end
    end
    local used, last = bucket_now(key, rate, now, v)
    -- Refills count from last, which is later than now when time stepped back: every wait
    -- starts there.
    local lag = last - now
    local room = burst * window - used
    local needed = cost * window
    if cost <= burst and needed <= room and cost > 0 and not only_decide then
      local remaining, reset = token_bucket_take(key, rate, window, burst, now_us, cost, used + needed, last, lag)
      return 1, remaining, reset, -1
    end
    local allowed, remaining, reset, retry = bucket_answer(used, lag, rate, window, burst, cost)
    if allowed == 0 then
      return 0, remaining, reset, retry
    end
    return 1, remaining, reset, -1, used + needed, last, lag
  end

  local function token_bucket(key, rate, window, burst, now_us, cost)
    return token_bucket_alone(key, rate, window, burst, now_us, cost, nil, nil, true)
  end

  -- Gives back what token_bucket_alone took at now_us when a later policy of its check denied:
  -- the tokens put back at the refill time it kept, and the quota then, as decide would have
  -- replied.
  local function token_bucket_untake(key, rate, window, burst, now_us, cost)
    local now = ms_of(now_us)
    local used, last = bucket_now(key, rate, now)
    return token_bucket_take(key, rate, window, burst, now_us, cost, max(used - cost * window, 0), last, last - now)
  end

  -- Puts cost tokens back, never above the capacity; without at_us, takes cost more, past it.
  local token_bucket_settle = SETTLES and function(key, rate, window, burst, now_us, cost, at_us)
    local now = div(now_us, 1000)
    local used, last = bucket_now(key, rate, now)
    if at_us then
      if used == 0 then
        return 0
      end
      used = max(used - cost * window, 0)
    else
      -- Capped so that every sum stays exact in a double.
      used = min(used + cost * window, 2 ^ 53 - burst * window)
    end
    token_bucket_take(key, rate, window, burst, now_us, cost, used, last, last - now)
    return 1
  end
  return {
    decide = token_bucket, take = token_bucket_take, settle = token_bucket_settle, alone = token_bucket_alone,
    untake = token_bucket_untake, fresh = token_bucket_fresh, text = pair_text(bucket_state, redis_call),
    flush = function()
      flush(wrote_used, wrote_last)
    end,
  }
end
