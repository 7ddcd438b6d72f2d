-- GCRA (gcra): a string holding the theoretical arrival time (TAT) in microseconds. Each request
-- moves the TAT one emission interval later; it passes while TAT - now <= burst * interval.
-- Made by gcra_functions when a call first checks a policy of it (dispatch.lua), so a call
-- makes the functions of the algorithms it checks, not every algorithm's.
local function gcra_functions()
  -- The quota when the TAT is tat.
  local function gcra_quota(interval, tolerance, tat, now_us)
    return div(max(tolerance - (tat - now_us), 0), interval), ceil_div(tat - now_us, 1000)
  end

  -- GCRA admitting a request whose slot is at most slack_us away. Admitted: retry is the wait in
  -- ms until its slot (-1 without slack); denied: the wait until its slot is within slack_us.
  local function gcra_within(key, limit, window, burst, now_us, cost, slack_us)
    local interval = ceil_div(window * 1000, limit)
    local tolerance = burst * interval
    local tat = max(int(key, redis.call('GET', key)) or now_us, now_us)
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

  -- slack_us: delay mode's longest wait for a slot (nil or 0 rejects instead).
  local function gcra(key, limit, window, burst, now_us, cost, slack_us)
    return gcra_within(key, limit, window, burst, now_us, cost, slack_us or 0)
  end

  local function gcra_take(key, limit, window, burst, now_us, cost, new_tat, interval, tolerance)
    local remaining, reset = gcra_quota(interval, tolerance, new_tat, now_us)
    redis.call('SET', key, new_tat, 'PX', reset)
    return remaining, reset
  end

  -- Moves the TAT back by cost intervals, never before now: a TAT already past owes nothing.
  local gcra_refund = REFUNDS and function(key, limit, window, burst, now_us, cost, at_us)
    local tat = int(key, redis.call('GET', key))
    if tat == nil or tat <= now_us then
      return 0
    end
    redis.call('SET', key, str(max(tat - cost * ceil_div(window * 1000, limit), now_us)), 'KEEPTTL')
    return 1
  end
  return gcra, gcra_take, gcra_refund
end
