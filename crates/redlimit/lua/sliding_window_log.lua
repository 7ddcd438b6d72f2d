-- Sliding window log (swl): a sorted set of admitted request times (ms), members unique.
-- An entry at t counts while t > now - window.
local function log_score(key, reply)
  return int(key, reply[2])
end

ALGORITHMS.swl = function(key, p, now_us, cost)
  local now = div(now_us, 1000)
  local limit, window = p.limit, p.window
  call(key, 'ZREMRANGEBYSCORE', key, '-inf', str(now - window))
  local count = call(key, 'ZCARD', key)
  local newest = nil
  if count > 0 then
    newest = log_score(key, call(key, 'ZRANGE', key, -1, -1, 'WITHSCORES'))
  end
  local function quota(n, last)
    if last == nil then
      return view(limit - n, 0)
    end
    return view(limit - n, last + window - now)
  end
  local plan = { before = quota(count, newest) }
  if cost > limit then
    plan.denial = NEVER
  elseif count + cost > limit then
    -- The oldest count + cost - limit entries must leave the window first.
    local leaving = count + cost - limit
    local last_to_leave = log_score(key, call(key, 'ZRANGE', key, leaving - 1, leaving - 1, 'WITHSCORES'))
    plan.denial = last_to_leave + window - now
  else
    local newest_after = newest
    if cost > 0 then
      newest_after = math.max(newest or now, now)
    end
    plan.after = quota(count + cost, newest_after)
    plan.write = function()
      -- Members at the same millisecond are numbered after those already there.
      local taken = redis.call('ZCOUNT', key, str(now), str(now))
      local batch = {}
      for i = 0, cost - 1 do
        batch[#batch + 1] = str(now)
        batch[#batch + 1] = str(now) .. ':' .. str(taken + i)
        if #batch >= 1000 or i == cost - 1 then
          redis.call('ZADD', key, unpack(batch))
          batch = {}
        end
      end
      redis.call('PEXPIRE', key, str(newest_after + window - now))
    end
  end
  return plan
end
