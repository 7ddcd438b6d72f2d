-- GCRA (gcra): a string holding the theoretical arrival time (TAT) in microseconds. Each request
-- moves the TAT one emission interval later; it passes while TAT - now <= burst * interval.
ALGORITHMS.gcra = function(key, p, now_us, cost)
  local interval = ceil_div(p.window * 1000, p.limit)
  local burst = p.burst
  local tolerance = burst * interval
  local tat = int(key, call(key, 'GET', key)) or now_us
  tat = math.max(tat, now_us)
  local function quota(t)
    return view(div(math.max(tolerance - (t - now_us), 0), interval), ceil_div(t - now_us, 1000))
  end
  local plan = { before = quota(tat) }
  local new_tat = tat + cost * interval
  if cost > burst then
    plan.denial = NEVER
  elseif new_tat - now_us > tolerance then
    plan.denial = ceil_div(new_tat - tolerance - now_us, 1000)
  else
    plan.after = quota(new_tat)
    plan.write = function()
      redis.call('SET', key, str(new_tat), 'PX', str(ceil_div(new_tat - now_us, 1000)))
    end
  end
  return plan
end
