-- GCRA (gcra): a string 'tat:interval', the theoretical arrival time (TAT) and the emission
-- interval it was reached by, both in microseconds. Each request moves the TAT one interval
-- later; it passes while TAT - now <= burst * interval. A TAT reached by another interval (a
-- changed limit) is read as the same number of requests owed, at the interval in force.
-- Made by gcra_functions when a call first checks a policy of it (dispatch.lua), so a call
-- makes the functions of the algorithms it checks, not every algorithm's.
local function gcra_functions()
  -- The most a settle may leave owed (us), so that every TAT stays exact in a double.
  local MAX_DEBT = 2 ^ 52

  -- The TAT at key at now_us under interval: never before now.
  local function gcra_tat(key, interval, now_us)
    local v = redis.call('GET', key)
    if not v then
      return now_us
    end
    local tat, was = match(v, '^(%d+):(%d+)$')
    if not tat or #tat > 16 or #was > 16 or was == '0' then
      corrupt(key, 'is not a GCRA state')
    end
    tat, was = tonumber(tat), tonumber(was)
    if tat <= now_us then
      return now_us
    elseif was ~= interval then
      -- The same operations as the memory backend's, so both round alike.
      return now_us + math.ceil((tat - now_us) * interval / was)
    end
    return tat
  end

  -- The quota when the TAT is tat.
  local function gcra_quota(interval, tolerance, tat, now_us)
    return div(max(tolerance - (tat - now_us), 0), interval), ceil_div(tat - now_us, 1000)
  end

  -- GCRA admitting a request whose slot is at most slack_us away. Admitted: retry is the wait in
  -- ms until its slot (-1 without slack); denied: the wait until its slot is within slack_us.
  -- slack_us: delay mode's longest wait for a slot (nil or 0 rejects instead).
  local function gcra(key, limit, window, burst, now_us, cost, slack_us)
    slack_us = slack_us or 0
    local interval = ceil_div(window * 1000, limit)
    local tolerance = burst * interval
    local tat = gcra_tat(key, interval, now_us)
    local remaining, reset = gcra_quota(interval, tolerance, tat, now_us)
    local new_tat = tat + cost * interval
    if cost > burst then
      return 0, remaining, reset, NEVER
    elseif new_tat - now_us > tolerance + slack_us then
      return 0, remaining, reset, ceil_div(new_tat - tolerance - slack_us - now_us, 1000)
    end
    local wait = -1
    if slack_us > 0 then
      wait = ceil_div(max(new_tat - tolerance - now_us, 0), 1000)
    end
    return 1, remaining, reset, wait, new_tat, interval, tolerance
  end

  local function gcra_take(key, limit, window, burst, now_us, cost, new_tat, interval, tolerance)
    local remaining, reset = gcra_quota(interval, tolerance, new_tat, now_us)
    redis.call('SET', key, str(new_tat) .. ':' .. str(interval), 'PX', reset)
    return remaining, reset
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
    if tat == now_us then
      redis.call('DEL', key)
    else
      gcra_take(key, limit, window, burst, now_us, cost, tat, interval, burst * interval)
    end
    return 1
  end
  return gcra, gcra_take, gcra_settle
end
