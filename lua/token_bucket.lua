-- Token bucket (tb): hash t = tokens multiplied by the window (ms), l = last refill (ms).
-- limit tokens per window refill it, burst tokens fill it.
-- Made by token_bucket_functions when a call first checks a policy of it (dispatch.lua), so a call
-- makes the functions of the algorithms it checks, not every algorithm's.
local function token_bucket_functions()
  local function token_bucket(key, rate, window, burst, now_us, cost)
    local now = div(now_us, 1000)
    local full = burst * window
    local stored, last = ints(key, redis.call('HMGET', key, 't', 'l'))
    local tokens = full
    if stored == nil then
      last = now
    else
      stored = min(stored, full)
      local elapsed = max(now - last, 0)
      if elapsed < ceil_div(full - stored, rate) then
        tokens = stored + elapsed * rate
      end
      last = max(last, now)
    end
    -- Refills count from last, which is later than now when time stepped back: every wait starts
    -- there.
    local lag = last - now
    local remaining, reset = div(tokens, window), lag + ceil_div(full - tokens, rate)
    local needed = cost * window
    if cost > burst then
      return 0, remaining, reset, NEVER
    elseif needed > tokens then
      return 0, remaining, reset, lag + ceil_div(needed - tokens, rate)
    end
    return 1, remaining, reset, -1, tokens - needed, last, lag
  end

  local function token_bucket_take(key, rate, window, burst, now_us, cost, left, last, lag)
    local reset = lag + ceil_div(burst * window - left, rate)
    redis.call('HSET', key, 't', left, 'l', last)
    redis.call('PEXPIRE', key, reset)
    return div(left, window), reset
  end

  -- Puts cost tokens back, never above the capacity.
  local token_bucket_refund = REFUNDS and function(key, limit, window, burst, now_us, cost, at_us)
    local tokens = ints(key, redis.call('HMGET', key, 't', 'l'))
    if tokens == nil then
      return 0
    end
    redis.call('HSET', key, 't', min(tokens + cost * window, burst * window))
    return 1
  end
  return token_bucket, token_bucket_take, token_bucket_refund
end
