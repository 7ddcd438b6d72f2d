-- Token bucket (tb): hash t = tokens multiplied by the window (ms), l = last refill (ms).
-- limit tokens per window refill it, burst tokens fill it.
ALGORITHMS.tb = function(key, p, now_us, cost)
  local now = div(now_us, 1000)
  local rate, window, burst = p.limit, p.window, p.burst
  local full = burst * window
  local state = fields(key, 't', 'l')
  local tokens, last = full, now
  if state[1] ~= nil then
    local stored = math.min(state[1], full)
    local elapsed = math.max(now - state[2], 0)
    if elapsed >= ceil_div(full - stored, rate) then
      tokens = full
    else
      tokens = stored + elapsed * rate
    end
    last = math.max(state[2], now)
  end
  local function quota(t)
    return view(div(t, window), ceil_div(full - t, rate))
  end
  local plan = { before = quota(tokens) }
  local needed = cost * window
  if cost > burst then
    plan.denial = NEVER
  elseif needed > tokens then
    plan.denial = ceil_div(needed - tokens, rate)
  else
    local left = tokens - needed
    plan.after = quota(left)
    plan.write = function()
      redis.call('HSET', key, 't', str(left), 'l', str(last))
      redis.call('PEXPIRE', key, str(ceil_div(full - left, rate)))
    end
  end
  return plan
end
