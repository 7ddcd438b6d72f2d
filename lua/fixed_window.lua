-- Fixed window, aligned (fw: windows start at multiples of the window) or anchored (fwa: the
-- window starts at the client's first hit). A window whose count stays below PACK is one string,
-- the window start (ms) and the count in six digits (start * 10^6 + n), so a take is one INCRBY;
-- Redis counts it in 64-bit integers, exact until the year 2262. A window created under a limit
-- of PACK or more, or whose count reaches PACK (a settle charging past the limit), is a hash:
-- s = start, n = count. Either form is read under any limit, so a changed limit keeps the count.
-- The TTL is set when a window's counter is created and never extended.
-- Made by fixed_window_functions when a call first checks a policy of it (dispatch.lua), so a call
-- makes the functions of the algorithms it checks, not every algorithm's.
local function fixed_window_functions()
  local PACK = 1000000

  -- The window start, count and whether it is packed at key; nil, nil, false when absent. The form the limit chooses is read first; the
  -- other only when Redis answers WRONGTYPE (state kept from a limit on the other side of PACK).
  local function window_state(key, limit)
    local packed = limit < PACK
    local reply
    if packed then
      reply = redis.pcall('GET', key)
    else
      reply = redis.pcall('HMGET', key, 's', 'n')
    end
    if type(reply) == 'table' and reply.err then
      packed = not packed
      if packed then
        reply = redis.call('GET', key)
      else
        reply = redis.call('HMGET', key, 's', 'n')
      end
    end
    if not packed then
      local start, n = ints(key, reply)
      return start, n, false
    end
    local v = digits(key, reply, 19)
    if not v then
      return nil, nil, false
    end
    -- Split as text: a double holds the whole number only below 2^53.
    return tonumber(string.sub(v, 1, -7)) or 0, tonumber(string.sub(v, -6)), true
  end

  -- The quota with n counted in the window ending at finish.
  local function window_quota(limit, n, finish, now)
    if n > 0 then
      return max(limit - n, 0), finish - now
    end
    return limit, 0
  end

  -- The window a check at now counts in: its start, count so far and form.
  local function window_now(key, limit, window, now, aligned)
    local start, n, packed = window_state(key, limit)
    local fresh = now
    if aligned then
      fresh = div(now, window) * window
    end
    -- A check stamped before the stored window (a clock that stepped back) counts in it: a fresh
    -- window there would admit the limit once more.
    if start == nil or (aligned and start < fresh) or (not aligned and now >= start + window) then
      return fresh, 0, packed
    end
    return start, n, packed
  end

  local function window_decide(key, limit, window, now_us, cost, aligned)
    local now = div(now_us, 1000)
    local start, n, packed = window_now(key, limit, window, now, aligned)
    local finish = start + window
    local remaining, reset = window_quota(limit, n, finish, now)
    if cost > limit then
      return 0, remaining, reset, NEVER
    elseif n + cost > limit then
      return 0, remaining, reset, finish - now
    end
    return 1, remaining, reset, -1, start, n, now, packed
  end

  local function fixed_window(key, limit, window, burst, now_us, cost)
    return window_decide(key, limit, window, now_us, cost, true)
  end

  local function fixed_window_anchored(key, limit, window, burst, now_us, cost)
    return window_decide(key, limit, window, now_us, cost, false)
  end

  -- Adds cost to the window at start holding n (packed or not), whatever the limit.
  local function fixed_window_take(key, limit, window, burst, now_us, cost, start, n, now, packed)
    local finish = start + window
    if n == 0 and limit < PACK and cost < PACK then
      redis.call('SET', key, str(start) .. format('%06d', cost), 'PX', finish - now)
    elseif n > 0 and packed and n + cost < PACK then
      redis.call('INCRBY', key, cost)
    elseif n > 0 and not packed then
      redis.call('HINCRBY', key, 'n', cost)
    else
      -- A new window of a limit of PACK or more, or a packed count that would carry into the
      -- start's digits: a hash, in place of any string there.
      if packed then
        redis.call('DEL', key)
      end
      redis.call('HSET', key, 's', start, 'n', n + cost)
      redis.call('PEXPIRE', key, finish - now)
    end
    return window_quota(limit, n + cost, finish, now)
  end

  -- Gives back to the window holding at_us (a newer window owes the reservation nothing), or,
  -- without at_us, charges cost to the current window past the limit.
  local function window_settle(aligned)
    return function(key, limit, window, burst, now_us, cost, at_us)
      if not at_us then
        local now = div(now_us, 1000)
        local start, n, packed = window_now(key, limit, window, now, aligned)
        -- Capped so that the count stays exact in a double.
        cost = max(min(cost, 2 ^ 52 - n), 0)
        fixed_window_take(key, limit, window, burst, now_us, cost, start, n, now, packed)
        return 1
      end
      local at = div(at_us, 1000)
      local start, n, packed = window_state(key, limit)
      if start == nil or at < start or at >= start + window or n == 0 then
        return 0
      end
      if packed then
        redis.call('DECRBY', key, min(n, cost))
      else
        redis.call('HINCRBY', key, 'n', -min(n, cost))
      end
      return 1
    end
  end
  return fixed_window, fixed_window_anchored, fixed_window_take, SETTLES and window_settle(true),
    SETTLES and window_settle(false)
end
