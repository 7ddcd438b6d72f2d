-- GCRA (gcra): a string of two big-endian 8-byte integers (16 bytes), the theoretical arrival
-- time (TAT) and the emission interval it was reached by, both in microseconds; the text
-- 'tat:interval' versions before kept is read alike and rewritten in this form by the next
-- admission (packed, as the token bucket's is: read by struct in one call, written without a
-- text formatted per state). Each request moves the TAT one interval
-- later; it passes while TAT - now <= burst * interval. A TAT reached by another interval (a
-- changed limit) is read as the same number of requests owed, at the interval in force.
-- Made by gcra_functions when a call first checks a policy of it (dispatch.lua), so a call
-- makes the functions of the algorithms it checks, not every algorithm's: a table of
-- them by name (see the prelude).
local function gcra_functions(call)
  -- Over Redis, or over a key group's records (groups.lua) when given its calls.
  local redis_call = call or redis_call
  -- The most a settle may leave owed (us), so that every TAT stays exact in a double.
  local MAX_DEBT = 2 ^ 52
  -- Every quotient here is floor(x / y) as a double division, exact without div's correction:
  -- x stays below 2^52 + 2^50 (the most debt, plus the largest tolerance a policy may have) and
  -- y >= 1, and a double quotient rounds up to the next integer only when x + y >= 2^53.
  -- (Instructions per decision, batches of 64 under callgrind: 45,600 -> see check.lua.)

  -- The interval (us) of the last limit and window asked: a call's checks mostly share one
  -- policy, so it is worked out once (where asked, not in a function of its own: a call costs
  -- as much).
  local at_limit, at_window, interval = nil, nil, nil
  local ttls = texts()
  -- The state a first admission writes, its TAT and interval, packed.
  local first_packed = packer()
  -- What this call wrote at each key: its TAT (false where it deleted the key) and interval. A
  -- script runs alone and its keys do not expire while it runs, so a client checked again in
  -- the same call (a hot one) is read from here, not from Redis: one command a decision, its
  -- write, where the other read and wrote. Redis instructions per decision,
  -- uniform / Zipf keys, measured as the SET NX GET below: 23,014 / 28,857 -> 24,461 / 26,652
  -- (a table entry per client costs where clients do not repeat, and saves a read where they
  -- do).
  local wrote_tat, wrote_interval = write_caches(call)
  local write, flush, forget = pair_writes(call, ttls)
  -- A call's start, where these functions outlive the call (library.lua): what the last call
  -- wrote is Redis's now, read from there.
  local function gcra_fresh()
    if next(wrote_tat) then
      wrote_tat, wrote_interval = write_caches(call)
      forget()
    end
  end

  -- Sets key to the TAT tat reached by interval, owing reset ms.
  local function gcra_write(key, tat, interval, reset)
    write(key, tat, interval, reset)
    wrote_tat[key], wrote_interval[key] = tat, interval
  end

  -- The TAT and interval stored in v, the value at key.
  local function gcra_state(key, v)
    local tat, was = pair_of(v)
    if not tat or was == 0 then
      corrupt(key, 'is not a GCRA state')
    end
    return tat, was
  end

  -- The TAT at key at now_us under interval, from v, the key's value (read when this call has
  -- not written it and v is nil): never before now.
  local function gcra_tat(key, interval, now_us, v)
    local tat, was = wrote_tat[key], wrote_interval[key]
    if tat == nil then
      v = v or redis_call('GET', key)
      if not v then
        return now_us
      end
      tat, was = gcra_state(key, v)
    end
    if not tat or tat <= now_us then
      return now_us
    elseif was ~= interval then
      -- The same operations as the memory backend's, so both round alike.
      return now_us + ceil((tat - now_us) * interval / was)
    end
    return tat
  end

  local function gcra_take(key, limit, window, burst, now_us, cost, new_tat, interval, tolerance)
    local owed = new_tat - now_us
    local reset = floor((owed + 999) / 1000)
    gcra_write(key, new_tat, interval, reset)
    return floor(max(tolerance - owed, 0) / interval), reset
  end

  -- Stores the TAT tat (never before now) reached by interval: no key where it owes nothing, as
  -- no key would. Returns the quota then.
  local function gcra_put(key, limit, window, burst, now_us, tat, interval)
    if tat == now_us then
      write(key, nil, nil, false)
      wrote_tat[key] = false
      return burst, 0
    end
    return gcra_take(key, limit, window, burst, now_us, 0, tat, interval, burst * interval)
  end

  -- GCRA admitting a request whose slot is at most slack_us away. Admitted: retry is the wait in
  -- ms until its slot (-1 without slack); denied: the wait until its slot is within slack_us.
  -- slack_us: delay mode's longest wait for a slot (nil or 0 rejects instead). Instructions per
  -- decision against decide then take, 64 per call on 10,000 keys: 34,295 -> 31,763.
  local function gcra_alone(key, limit, window, burst, now_us, cost, _, slack_us, only_decide)
    slack_us = slack_us or 0
    if limit ~= at_limit or window ~= at_window then
      at_limit, at_window, interval = limit, window, ceil_div(window * 1000, limit)
    end
    local tolerance = burst * interval
    local v = nil
    if cost > 0 and cost <= burst and not only_decide and wrote_tat[key] == nil then
      -- An absent key owes nothing (its TTL ends when its TAT is reached), so the admission
      -- it must then be is written by the read itself, the key set only where it is absent:
      -- one command of state, not two, for a client back within its rate. Redis instructions
      -- per decision, uniform / Zipf keys (`redlimit-bench --mode instructions --decisions
      -- 40000`): 28,127 / 31,037 -> 23,014 / 28,857.
      local owed = cost * interval
      local reset = floor((owed + 999) / 1000)
      v = redis_call('SET', key, first_packed(now_us + owed, interval), 'NX', 'GET', 'PX', ttls[reset])
      if not v then
        wrote_tat[key], wrote_interval[key] = now_us + owed, interval
        return 1, floor((tolerance - owed) / interval), reset, slack_us > 0 and 0 or -1
      end
    end
    local owed = gcra_tat(key, interval, now_us, v) - now_us
    local new_owed = owed + cost * interval
    local allowed, wait = 1, -1
    if cost > burst then
      allowed, wait = 0, NEVER
    elseif new_owed > tolerance + slack_us then
      allowed, wait = 0, floor((new_owed - tolerance - slack_us + 999) / 1000)
    elseif slack_us > 0 then
      wait = floor((max(new_owed - tolerance, 0) + 999) / 1000)
    end
    if allowed == 1 and cost > 0 and not only_decide then
      -- gcra_take's write, here to save a call.
      local reset = floor((new_owed + 999) / 1000)
      gcra_write(key, now_us + new_owed, interval, reset)
      return 1, floor(max(tolerance - new_owed, 0) / interval), reset, wait
    end
    local remaining, reset = floor(max(tolerance - owed, 0) / interval), floor((owed + 999) / 1000)
    if allowed == 0 then
      return 0, remaining, reset, wait
    end
    return 1, remaining, reset, wait, now_us + new_owed, interval, tolerance
  end

  local function gcra(key, limit, window, burst, now_us, cost, slack_us)
    return gcra_alone(key, limit, window, burst, now_us, cost, nil, slack_us, true)
  end

  -- Gives back what gcra_alone took at now_us when a later policy of its check denied: the TAT
  -- cost intervals earlier, and the quota then, as decide would have replied.
  local function gcra_untake(key, limit, window, burst, now_us, cost)
    local interval = ceil_div(window * 1000, limit)
    local tat = max(gcra_tat(key, interval, now_us) - cost * interval, now_us)
    return gcra_put(key, limit, window, burst, now_us, tat, interval)
  end

  -- Moves the TAT back by cost intervals, never before now (a TAT already past owes nothing);
  -- without at_us, cost intervals later, past the tolerance.
  local gcra_settle = SETTLES and function(key, limit, window, burst, now_us, cost, at_us)
    local interval = ceil_div(window * 1000, limit)
    local tat = gcra_tat(key, interval, now_us)
    if at_us then
      if tat == now_us then
        return 0
      end
      tat = max(tat - cost * interval, now_us)
    else
      tat = min(tat + cost * interval, now_us + MAX_DEBT)
    end
    gcra_put(key, limit, window, burst, now_us, tat, interval)
    return 1
  end
  return {
    decide = gcra, take = gcra_take, settle = gcra_settle, alone = gcra_alone, untake = gcra_untake,
    fresh = gcra_fresh, text = pair_text(gcra_state, redis_call),
    flush = function()
      flush(wrote_tat, wrote_interval)
    end,
  }
end
