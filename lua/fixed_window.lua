-- Fixed window, aligned (fw: windows start at multiples of the window) or anchored (fwa: the
-- window starts at the client's first hit). A limit below PACK is one string, the window start
-- (ms) and the count in six digits (start * 10^6 + n), so a take is one INCRBY; Redis counts it
-- in 64-bit integers, exact until the year 2262. A larger limit keeps a hash: s = start, n =
-- count. The TTL is set when a window's counter is created and never extended.
-- Made by fixed_window_functions when a call first checks a policy of it (dispatch.lua), so a call
-- makes the functions of the algorithms it checks, not every algorithm's.
local function fixed_window_functions()
  local PACK = 1000000

  -- The window start and count at key: nil when absent.
  local function window_state(key, limit)
    if limit >= PACK then
      return ints(key, redis.call('HMGET', key, 's', 'n'))
    end
    local v = digits(key, redis.call('GET', key), 19)
    if not v then
      return nil
    end
    -- Split as text: a double holds the whole number only below 2^53.
    return tonumber(string.sub(v, 1, -7)) or 0, tonumber(string.sub(v, -6))
  end

  -- The quota with n counted in the window ending at finish.
  local function window_quota(limit, n, finish, now)
    if n > 0 then
      return max(limit - n, 0), finish - now
    end
    return limit, 0
  end

  local function window_decide(key, limit, window, now_us, cost, aligned)
    local now = div(now_us, 1000)
    local start, n = window_state(key, limit)
    local fresh = now
    if aligned then
      fresh = div(now, window) * window
    end
    -- A check stamped before the stored window (a clock that stepped back) counts in it: a fresh
    -- window there would admit the limit once more.
    if start == nil or (aligned and start < fresh) or (not aligned and now >= start + window) then
      start, n = fresh, 0
    end
    local finish = start + window
    local remaining, reset = window_quota(limit, n, finish, now)
    if cost > limit then
      return 0, remaining, reset, NEVER
    elseif n + cost > limit then
      return 0, remaining, reset, finish - now
    end
    return 1, remaining, reset, -1, start, n, now
  end

  local function fixed_window(key, limit, window, burst, now_us, cost)
    return window_decide(key, limit, window, now_us, cost, true)
  end

  local function fixed_window_anchored(key, limit, window, burst, now_us, cost)
    return window_decide(key, limit, window, now_us, cost, false)
  end

  local function fixed_window_take(key, limit, window, burst, now_us, cost, start, n, now)
    local finish = start + window
    if limit >= PACK then
      if n == 0 then
        redis.call('HSET', key, 's', start, 'n', cost)
        redis.call('PEXPIRE', key, finish - now)
      else
        redis.call('HINCRBY', key, 'n', cost)
      end
    elseif n == 0 then
      redis.call('SET', key, str(start) .. format('%06d', cost), 'PX', finish - now)
    else
      redis.call('INCRBY', key, cost)
    end
    return window_quota(limit, n + cost, finish, now)
  end

  -- Counts in the window holding at_us: a newer window owes the reservation nothing.
  local fixed_window_refund = REFUNDS and function(key, limit, window, burst, now_us, cost, at_us)
    local at = div(at_us, 1000)
    local start, n = window_state(key, limit)
    if start == nil or at < start or at >= start + window or n == 0 then
      return 0
    end
    if limit >= PACK then
      redis.call('HINCRBY', key, 'n', -min(n, cost))
    else
      redis.call('DECRBY', key, min(n, cost))
    end
    return 1
  end
  return fixed_window, fixed_window_anchored, fixed_window_take, fixed_window_refund
end
