-- Fixed window, aligned (fw: windows start at multiples of the window) or anchored (fwa: the
-- window starts at the client's first hit). Hash: s = window start (ms), n = count.
-- The TTL is set when a window's counter is created and never extended.
local function fixed_window(aligned)
  return function(key, p, now_us, cost)
    local now = div(now_us, 1000)
    local limit, window = p.limit, p.window
    local fresh = now
    if aligned then
      fresh = div(now, window) * window
    end
    local state = fields(key, 's', 'n')
    local start, count = state[1], state[2]
    local current = start ~= nil
      and ((aligned and start == fresh) or (not aligned and start <= now and now < start + window))
    if not current then
      start, count = fresh, 0
    end
    local finish = start + window
    local function quota(n)
      if n > 0 then
        return view(limit - n, finish - now)
      end
      return view(limit, 0)
    end
    local plan = { before = quota(count) }
    if cost > limit then
      plan.denial = NEVER
    elseif count + cost > limit then
      plan.denial = finish - now
    else
      plan.after = quota(count + cost)
      plan.write = function()
        if count == 0 then
          redis.call('HSET', key, 's', str(start), 'n', str(cost))
          redis.call('PEXPIRE', key, str(finish - now))
        else
          redis.call('HINCRBY', key, 'n', str(cost))
        end
      end
    end
    return plan
  end
end

ALGORITHMS.fw = fixed_window(true)
ALGORITHMS.fwa = fixed_window(false)
