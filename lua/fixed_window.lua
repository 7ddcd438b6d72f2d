-- Fixed window, aligned (fw: windows start at multiples of the window) or anchored (fwa: the
-- window starts at the client's first hit). A window whose count stays below COUNTS is one
-- string, its head and the count in six digits (head * 10^6 + n): the head is the window's
-- number (start / window) for fw; for fwa its start in ms, or in the short form its start's
-- remainder (see SPAN). Redis counts it in 64-bit integers, exact until the year 2262. A
-- window created under a limit of COUNTS or more, or whose count reaches COUNTS (a settle
-- charging past the limit), is a hash: s = start (ms), n = count.
-- Either form is read under any limit, so a changed limit keeps the count. The TTL is set when a
-- window's counter is created and never extended.
-- Made by fixed_window_functions when a call first checks a policy of it (dispatch.lua), so a call
-- makes the functions of the algorithms it checks, not every algorithm's: a table of them by
-- name (see the prelude) for fw, and one for fwa.
local function fixed_window_functions(call, pcall_call)
  -- Over Redis, or over a key group's records (groups.lua) when given its calls.
  local redis_call, redis_pcall = call or redis_call, pcall_call or redis_pcall
  local PACK = 1000000
  -- A packed count stays below COUNTS (WINDOW_COUNTS, from protocol.rs: PACK / 2), so a count
  -- and a cost (at most the limit, below COUNTS) never carry into the head's digits.
  local COUNTS = WINDOW_COUNTS
  -- fw's window numbers below this keep head * PACK + n below 2^53, where the sum INCRBY
  -- replies is exact in a double: windows of 200 ms or more until the year 2255.
  local EXACT_HEADS = 2 ^ 53 / PACK - 1
  -- fwa's short form, written at Redis TIME for windows of at most SHORT_WINDOWS: its head is
  -- the start mod SPAN (SPAN for a remainder of 0, so that a head of 0 stays no window), so that
  -- head * PACK + n stays below 2^53 and INCRBY replies it exactly: an admission is one INCRBY,
  -- as fw's (a start in ms is 13 digits, times PACK past 2^53). A short head is read as the
  -- start nearest now with its remainder, exact while the start lies within SPAN / 2 (46 days)
  -- of now: Redis time keeps it there (the key lives one window; a clock stepped back by less
  -- than that still counts in the window), a client's `at` may jump anywhere, so a window made
  -- at an `at`, or longer than SHORT_WINDOWS, keeps its start whole (13 digits or more, over
  -- SPAN; a start within SPAN of 1970 is read as short).
  local SPAN = 8 * 10 ^ 9
  local SHORT_WINDOWS = SPAN / 2
  -- Texts of TTLs and counts, and of packed windows by cost then head (a head times PACK can
  -- pass 2^53): a batch's new windows share them.
  local text = texts()
  local packed_text = texts_by(function(cost)
    return format('%06d', cost)
  end)

  -- The start (ms) of fwa's window whose head is head, read at now (ms).
  local function anchored_start(head, now)
    if head == 0 or head > SPAN then
      return head
    end
    -- Exact: |head - now| < 2^53, and a quotient by SPAN lies at least 1 / SPAN from the
    -- nearest integer, far beyond a double's rounding.
    local ahead = (head - now) % SPAN
    if ahead > SPAN / 2 then
      ahead = ahead - SPAN
    end
    return now + ahead
  end

  -- The head a new window starting at start (ms) is written with: fw's (aligned) or fwa's.
  local function head_of(start, window, aligned)
    if aligned then
      return start / window
    elseif server_time and window <= SHORT_WINDOWS then
      local head = start % SPAN
      return head == 0 and SPAN or head
    end
    return start
  end

  -- The window start, count and whether it is packed at key, read at now (ms); nil, nil, false
  -- when absent. The form the limit chooses is read first, the other only when Redis answers
  -- WRONGTYPE (state kept from a limit on the other side of COUNTS). aligned: fw's, else fwa's.
  local function window_state(key, limit, window, aligned, now)
    local packed = limit < COUNTS
    local reply
    if packed then
      reply = redis_pcall('GET', key)
    else
      reply = redis_pcall('HMGET', key, 's', 'n')
    end
    if type(reply) == 'table' and reply.err then
      packed = not packed
      if packed then
        reply = redis_call('GET', key)
      else
        reply = redis_call('HMGET', key, 's', 'n')
      end
    end
    if not packed then
      local start, n = ints(key, reply)
      return start, n, false
    end
    local v = digits(key, reply, 19)
    if not v then
      return nil, nil, false
    end
    -- Split as text: a double holds the whole number only below 2^53.
    local head, n = tonumber(string.sub(v, 1, -7)) or 0, string.sub(v, -6) + 0
    if aligned then
      return head * window, n, true
    end
    return anchored_start(head, now), n, true
  end

  -- The quota with n counted in the window ending at finish.
  local function window_quota(limit, n, finish, now)
    if n > 0 then
      return max(limit - n, 0), finish - now
    end
    return limit, 0
  end

  -- The window a check at now counts in: its start, count so far and form.
  local function window_now(key, limit, window, now, aligned)
    local fresh = aligned and div(now, window) * window or now
    local start, n, packed = window_state(key, limit, window, aligned, now)
    -- A check stamped before the stored window (a clock that stepped back) counts in it: a fresh
    -- window there would admit the limit once more.
    if start == nil or (aligned and start < fresh) or (not aligned and now >= start + window) then
      return fresh, 0, packed
    end
    return start, n, packed
  end

  local function window_decide(key, limit, window, now_us, cost, aligned)
    local now = div(now_us, 1000)
    local start, n, packed = window_now(key, limit, window, now, aligned)
    local finish = start + window
    local remaining, reset = window_quota(limit, n, finish, now)
    if cost > limit then
      return 0, remaining, reset, NEVER
    elseif n + cost > limit then
      return 0, remaining, reset, finish - now
    end
    return 1, remaining, reset, -1, start, n, now, packed
  end

  local function fixed_window(key, limit, window, burst, now_us, cost)
    return window_decide(key, limit, window, now_us, cost, true)
  end

  local function fixed_window_anchored(key, limit, window, burst, now_us, cost)
    return window_decide(key, limit, window, now_us, cost, false)
  end

  -- Adds cost to the window at start holding n (packed or not), whatever the limit; aligned:
  -- fw's window, else fwa's.
  local function fixed_window_take(key, limit, window, burst, now_us, cost, start, n, now, packed, aligned)
    local finish = start + window
    if n == 0 and limit < COUNTS and cost < COUNTS then
      redis_call('SET', key, packed_text[cost][head_of(start, window, aligned)], 'PX', text[finish - now])
    elseif n > 0 and packed and n + cost < COUNTS then
      redis_call('INCRBY', key, text[cost])
    elseif n > 0 and not packed then
      redis_call('HINCRBY', key, 'n', cost)
    else
      -- A new window of a limit of COUNTS or more, or a packed count that would reach COUNTS:
      -- a hash, in place of any string there.
      if packed then
        redis_call('DEL', key)
      end
      redis_call('HSET', key, 's', start, 'n', n + cost)
      redis_call('PEXPIRE', key, finish - now)
    end
    return window_quota(limit, n + cost, finish, now)
  end

  local function fixed_window_take_aligned(key, limit, window, burst, now_us, cost, start, n, now, packed)
    return fixed_window_take(key, limit, window, burst, now_us, cost, start, n, now, packed, true)
  end

  local function fixed_window_take_anchored(key, limit, window, burst, now_us, cost, start, n, now, packed)
    return fixed_window_take(key, limit, window, burst, now_us, cost, start, n, now, packed, false)
  end

  -- A check of one policy, decided and taken in one (fw's when aligned, else fwa's): INCRBY
  -- first, so an admission in a running window is one command (a new window adds a SET ... PX,
  -- a denial a DECRBY giving it back); fwa counts so at Redis TIME, in its short form (see
  -- SPAN). Where INCRBY cannot count (a cost of 0 or past the limit, a hash's limit, fw's
  -- window number past EXACT_HEADS, fwa at a client's `at` or in a window past SHORT_WINDOWS or
  -- its whole start), decide then take. Decides exactly as they would. Each window's number at
  -- the time the call's checks share is worked out once per window (best of 7 runs 4.85 ->
  -- 4.09 us per decision, median 5.98 -> 5.37, measured as in check.lua; kept per window, so
  -- that a check of a minute's and an hour's window reuses both). Written out in one body:
  -- helpers called for the INCRBY and the reply cost fw 5-8% more instructions (19,325 ->
  -- 20,382 and 20,869 per decision, `--mode instructions` of the bench).
  -- cost_text: cost as its decimal text (a number argument to redis.call costs Redis a %.17g).
  local function window_alone(aligned)
    local indexes_at, now, indexes = nil, nil, {}
    return function(key, limit, window, burst, now_us, cost, cost_text)
      cost_text = cost_text or text[cost]
      if now_us ~= indexes_at then
        indexes_at, now, indexes = now_us, div(now_us, 1000), {}
      end
      local index, v = nil, nil
      if cost > 0 and cost <= limit and limit < COUNTS then
        if aligned then
          index = indexes[window]
          if not index then
            index = div(now, window)
            indexes[window] = index
          end
          if index < EXACT_HEADS then
            v = redis_pcall('INCRBY', key, cost_text)
          end
        elseif server_time and window <= SHORT_WINDOWS then
          v = redis_pcall('INCRBY', key, cost_text)
        end
      end
      -- Not counted by INCRBY (a hash: a limit on the other side of COUNTS; not an integer:
      -- the reading path says it is corrupt; a failed INCRBY wrote nothing), or counted past
      -- 2^53 (fwa's whole start, read as text), its cost given back: decide, then take.
      if type(v) ~= 'number' or v >= 2 ^ 53 then
        if type(v) == 'number' then
          redis_call('DECRBY', key, cost_text)
        end
        local allowed, remaining, reset, retry, b, c, d, e = window_decide(key, limit, window, now_us, cost, aligned)
        if allowed == 1 and cost > 0 then
          remaining, reset = fixed_window_take(key, limit, window, burst, now_us, cost, b, c, d, e, aligned)
        end
        return allowed, remaining, reset, retry
      end
      if v < cost then
        redis_call('DECRBY', key, cost_text)
        corrupt(key, 'holds a non-integer value')
      end
      -- v / PACK can round up to the next integer, never down below one.
      local head = floor(v / PACK)
      if head * PACK > v then
        head = head - 1
      end
      local n, finish = v - head * PACK, nil
      if aligned then
        if head < index then
          -- No window, or an ended one: this one starts with the cost.
          finish = (index + 1) * window
          redis_call('SET', key, text[index * PACK + cost], 'PX', text[finish - now])
          return 1, limit - cost, finish - now, -1
        end
        finish = (head + 1) * window
      else
        finish = anchored_start(head, now) + window
        if now >= finish then
          -- No window, or an ended one: this one starts now with the cost.
          redis_call('SET', key, packed_text[cost][head_of(now, window, false)], 'PX', text[window])
          return 1, limit - cost, window, -1
        end
      end
      -- This window, or a later one (a clock that stepped back counts in it).
      if n > limit then
        redis_call('DECRBY', key, cost_text)
        return 0, max(limit - n + cost, 0), finish - now, finish - now
      end
      return 1, limit - n, finish - now, -1
    end
  end

  -- Gives back what window_alone took at now_us, when a later policy of its check denied: the
  -- quota then, as decide would have seen it (fw's when aligned, else fwa's). An anchored
  -- window that take opened is deleted, as there was none before it: left open with nothing
  -- counted, it would start the client's next window now instead of at its next request.
  local function window_untake(aligned)
    return function(key, limit, window, burst, now_us, cost)
      if type(redis_pcall('DECRBY', key, text[cost])) ~= 'number' then
        redis_call('HINCRBY', key, 'n', -cost)
      end
      local now = div(now_us, 1000)
      local start, n = window_now(key, limit, window, now, aligned)
      if n == 0 and not aligned and start == now then
        redis_call('DEL', key)
      end
      return window_quota(limit, n, start + window, now)
    end
  end

  -- Gives back to the window holding at_us (a newer window owes the reservation nothing), or,
  -- without at_us, charges cost to the current window past the limit.
  local function window_settle(aligned)
    return function(key, limit, window, burst, now_us, cost, at_us)
      if not at_us then
        local now = div(now_us, 1000)
        local start, n, packed = window_now(key, limit, window, now, aligned)
        -- Capped so that the count stays exact in a double.
        cost = max(min(cost, 2 ^ 52 - n), 0)
        fixed_window_take(key, limit, window, burst, now_us, cost, start, n, now, packed, aligned)
        return 1
      end
      local at = div(at_us, 1000)
      local start, n, packed = window_state(key, limit, window, aligned, div(now_us, 1000))
      if start == nil or at < start or at >= start + window or n == 0 then
        return 0
      end
      if packed then
        redis_call('DECRBY', key, min(n, cost))
      else
        redis_call('HINCRBY', key, 'n', -min(n, cost))
      end
      return 1
    end
  end
  local aligned = {
    decide = fixed_window, take = fixed_window_take_aligned, settle = SETTLES and window_settle(true),
    alone = window_alone(true), untake = window_untake(true),
  }
  local anchored = {
    decide = fixed_window_anchored, take = fixed_window_take_anchored,
    settle = SETTLES and window_settle(false), alone = window_alone(false), untake = window_untake(false),
  }
  return aligned, anchored
end
