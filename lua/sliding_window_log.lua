-- Sliding window log (swl): a sorted set of admitted request times (ms), members unique (see
-- member).
-- An entry at t counts while t > now - window.
-- Made by sliding_window_log_functions when a call first checks a policy of it (dispatch.lua), so a call
-- makes the functions of the algorithms it checks, not every algorithm's: a table of
-- them by name (see the prelude).
local function sliding_window_log_functions()
  local text = texts()

  -- A member is its entry's time (ms, its score too) as 6 big-endian bytes, then its number as
  -- text: unique, and its time read back by struct in one call, where versions before wrote the
  -- text 'stamp:number', read by a pattern and a conversion (some 2,800 instructions a check),
  -- and a larger entry for Redis to walk past in the log's listpack. That text is read alike:
  -- its first byte is a digit, where a time's first byte stays below 32 until the year 3084.
  local STAMP = '>I6'
  local stamped_at, stamp = nil, nil
  local function member(now, number)
    if now ~= stamped_at then
      stamped_at, stamp = now, struct.pack(STAMP, now)
    end
    return stamp .. text[number]
  end

  -- The time (ms) of an entry of key's log, from a ZRANGE reply of its member alone (a score
  -- Redis replies as a double it formats with %.17g, some 1,700 instructions a check).
  local function entry_time(key, reply)
    local entry = reply[1]
    if entry and #entry > 6 then
      local time = struct.unpack(STAMP, entry)
      if time < 2 ^ 45 then
        return time
      end
    end
    local text_stamp = entry and match(entry, '^(%d+):%d+$')
    if not text_stamp or #text_stamp > 16 then
      corrupt(key, 'holds an entry not of its time and number')
    end
    return text_stamp + 0
  end

  local function sliding_window_log_take(key, limit, window, burst, now_us, cost, count, newest, expired)
    local now = ms_of(now_us)
    local score = text[now]
    -- Members are numbered from the count in the window: at one millisecond that count only
    -- grows, so numbers do not repeat while time moves forward. Should time step back onto a
    -- used number, ZADD adds fewer than asked and numbering goes on past it.
    local number, added = count, 0
    -- A check's usual cost, added without a table (instructions per decision, 64 per call on
    -- 10,000 keys, callgrind: 65,994 -> 61,890).
    if cost == 1 then
      added = redis_call('ZADD', key, score, member(now, number))
      number = number + 1
    end
    while added < cost do
      local batch = {}
      for _ = 1, min(cost - added, 500) do
        batch[#batch + 1] = score
        batch[#batch + 1] = member(now, number)
        number = number + 1
      end
      added = added + redis_call('ZADD', key, unpack(batch))
    end
    if expired > 0 then
      redis_call('ZREMRANGEBYSCORE', key, '-inf', text[now - window])
    end
    -- Comparisons and floors inline rather than max and math.floor: each call of a function
    -- costs Redis some 300 instructions. A floor of a double quotient of times in ms is exact.
    local reset = (newest > now and newest or now) + window - now
    -- The key's TTL is set at the first admission of each quarter of a window, not at every
    -- one: set then, it outlasts every entry of that quarter by a quarter (and a clock skewed
    -- by as much). Redis instructions per decision, uniform / Zipf keys (`redlimit-bench
    -- --mode instructions --decisions 40000`): 53,929 / 50,144 -> 49,955 / 48,452.
    local quarter = window / 4
    quarter = quarter < 1 and 1 or quarter - quarter % 1
    local newest_quarter, now_quarter = newest / quarter, now / quarter
    if newest < 0 or newest_quarter - newest_quarter % 1 ~= now_quarter - now_quarter % 1 then
      redis_call('PEXPIRE', key, text[reset + quarter])
    end
    return limit - count - cost, reset
  end

  -- The sliding log's alone (see the prelude): with only_decide, its decide, which writes
  -- nothing. Entries that left the window are skipped here and trimmed only by an admission,
  -- so that a denial or a peek writes nothing and an admission's first write is its ZADD, which
  -- Redis refuses when it is out of memory.
  local function sliding_window_log_alone(key, limit, window, burst, now_us, cost, _, _, only_decide)
    local now = ms_of(now_us)
    local expired = redis_call('ZCOUNT', key, '-inf', text[now - window])
    local count = redis_call('ZCARD', key) - expired
    local newest, reset = -1, 0
    if count > 0 then
      newest = entry_time(key, redis_call('ZRANGE', key, '-1', '-1'))
      reset = newest + window - now
    end
    local remaining = count < limit and limit - count or 0
    if cost > limit then
      return 0, remaining, reset, NEVER
    elseif count + cost > limit then
      -- The oldest count + cost - limit entries in the window must leave it first.
      local rank = text[expired + count + cost - limit - 1]
      return 0, remaining, reset, entry_time(key, redis_call('ZRANGE', key, rank, rank)) + window - now
    elseif only_decide or cost == 0 then
      return 1, remaining, reset, -1, count, newest, expired
    end
    remaining, reset = sliding_window_log_take(key, limit, window, burst, now_us, cost, count, newest, expired)
    return 1, remaining, reset, -1
  end

  local function sliding_window_log(key, limit, window, burst, now_us, cost)
    return sliding_window_log_alone(key, limit, window, burst, now_us, cost, nil, nil, true)
  end

  -- Removes up to cost entries stamped with the reservation's time; without at_us, adds cost
  -- entries now, past the limit, keeping the newest limit entries: a decision needs the
  -- (count + cost - limit)th oldest entry to leave, the same entry with or without the older
  -- ones, so the log stays bounded by the limit.
  local sliding_window_log_settle = SETTLES and function(key, limit, window, burst, now_us, cost, at_us)
    if not at_us then
      local now = div(now_us, 1000)
      local expired = redis_call('ZCOUNT', key, '-inf', now - window)
      local count = redis_call('ZCARD', key) - expired
      local newest = count > 0 and entry_time(key, redis_call('ZRANGE', key, -1, -1)) or now
      sliding_window_log_take(key, limit, window, burst, now_us, min(cost, limit), count, newest, expired)
      redis_call('ZREMRANGEBYRANK', key, 0, -(limit + 1))
      return 1
    end
    local at = div(at_us, 1000)
    local entries = redis_call('ZRANGEBYSCORE', key, at, at, 'LIMIT', 0, cost)
    if #entries == 0 then
      return 0
    end
    redis_call('ZREM', key, unpack(entries))
    return 1
  end
  -- A refund (REFUND): removes the newest cost entries, whenever they were taken; a settle
  -- removes only those stamped with its reservation's time.
  local sliding_window_log_refund = SETTLES and function(key, limit, window, burst, now_us, cost)
    return redis_call('ZREMRANGEBYRANK', key, -cost, -1) > 0 and 1 or 0
  end
  return {
    decide = sliding_window_log, take = sliding_window_log_take, settle = sliding_window_log_settle,
    alone = sliding_window_log_alone, refund = sliding_window_log_refund,
  }
end
