-- Sliding window counter (swc): hash w = current window index, p = previous window's count,
-- c = current window's count. The estimate prev * (window - elapsed) / window + curr is kept
-- multiplied by the window so every comparison is between integers.
local function counter_retry(limit, window, elapsed, prev, curr, cost)
  -- Later in this window, once prev * (window - e) <= (limit - curr - cost) * window.
  local room = limit - curr - cost
  if room >= 0 and prev > 0 then
    local fits = div(room * window, prev)
    if fits >= 1 then
      return window - fits - elapsed
    end
  end
  -- Otherwise in the next window, where curr becomes the previous count.
  local later = 0
  if curr > 0 then
    later = math.max(window - div((limit - cost) * window, curr), 0)
  end
  return window - elapsed + later
end

ALGORITHMS.swc = function(key, p, now_us, cost)
  local now = div(now_us, 1000)
  local limit, window = p.limit, p.window
  local index = div(now, window)
  local elapsed = now - index * window
  local state = fields(key, 'w', 'p', 'c')
  local prev, curr = 0, 0
  if state[1] == index then
    prev, curr = state[2], state[3]
  elseif state[1] ~= nil and state[1] + 1 == index then
    prev = state[3]
  end
  local capacity = limit * window
  local function estimate(c)
    return prev * (window - elapsed) + c * window
  end
  local function quota(c)
    local reset = 0
    if c > 0 then
      reset = 2 * window - elapsed
    elseif prev > 0 then
      reset = window - elapsed
    end
    return view(div(math.max(capacity - estimate(c), 0), window), reset)
  end
  local plan = { before = quota(curr) }
  if cost > limit then
    plan.denial = NEVER
  elseif estimate(curr) + cost * window > capacity then
    plan.denial = counter_retry(limit, window, elapsed, prev, curr, cost)
  else
    plan.after = quota(curr + cost)
    plan.write = function()
      if state[1] == index then
        -- Same window: the state's deadline (the end of the next window) has not moved.
        redis.call('HINCRBY', key, 'c', str(cost))
      else
        redis.call('HSET', key, 'w', str(index), 'p', str(prev), 'c', str(curr + cost))
        redis.call('PEXPIRE', key, str(2 * window - elapsed))
      end
    end
  end
  return plan
end
