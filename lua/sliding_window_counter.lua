-- Sliding window counter (swc): three big-endian 8-byte integers (24 bytes), w the current
-- window's index, p the previous window's count, c the current window's. The estimate
-- prev * (window - elapsed) + curr * window is the weighted count multiplied by the window, so
-- every comparison is between integers. One string (GET, then SET) rather than a hash (HMGET,
-- then HINCRBY, or HSET and PEXPIRE in a new window); the forms versions before kept, the text
-- 'w:p:c' and the hash (fields w, p, c), are read alike and rewritten in this form by the next
-- admission. Packed rather than text: struct reads and writes it in one call each, where a
-- pattern read the text (Redis instructions per decision, uniform / Zipf keys, `redlimit-bench
-- --mode instructions --decisions 40000`: 36,412 / 41,813 -> 35,603 / 34,119).
-- Made by sliding_window_counter_functions when a call first checks a policy of it (dispatch.lua), so a call
-- makes the functions of the algorithms it checks, not every algorithm's: a table of
-- them by name (see the prelude).
local function sliding_window_counter_functions()
  local text = texts()
  local function counter_quota(limit, window, elapsed, shift, prev, curr)
    local reset = 0
    if curr > 0 then
      reset = shift + 2 * window - elapsed
    elseif prev > 0 then
      reset = shift + window - elapsed
    end
    local room = limit * window - prev * (window - elapsed) - curr * window
    if room <= 0 then
      return 0, reset
    end
    return div(room, window), reset
  end

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
      later = max(window - div((limit - cost) * window, curr), 0)
    end
    return window - elapsed + later
  end

  -- Where in which window a check at now counts: a check stamped before the stored window (a
  -- clock that stepped back) is taken at that window's start, where its counts weigh the most;
  -- shift carries every wait back to now.
  local function counter_position(now, window, stored)
    -- floor(now / window) without div's correction: a double quotient of integers below 2^53
    -- rounds up to the next integer only where now + window reaches 2^53 (a time in ms never
    -- does). Inline, as are the comparisons below: each call of a function, Lua's or C's,
    -- costs Redis some 300 instructions, and the counter's check made some twenty.
    local index = now / window
    index = index - index % 1
    if stored ~= nil and stored > index then
      local start = stored * window
      return stored, 0, start - now
    end
    return index, now - index * window, 0
  end

  -- The state packed: its window index, previous and current counts.
  local PACKED = '>I8I8I8'

  -- The stored window index and its previous and current counts, from v, key's value (a GET's
  -- reply, which may be its error), and whether it is packed; nil, nil, nil when absent.
  local function counter_state(key, v)
    if v and #v == 24 then
      -- Packed, each number below 2^53; a text's first byte is a digit, so that one read as
      -- packed is not.
      local w, p, c = struct.unpack(PACKED, v)
      if w < 2 ^ 53 and p < 2 ^ 53 and c < 2 ^ 53 then
        return w, p, c, true
      end
    end
    if type(v) == 'table' then
      if v.err and match(v.err, 'WRONGTYPE') then
        return ints(key, redis_call('HMGET', key, 'w', 'p', 'c'))
      end
      error(v)
    elseif not v then
      return nil, nil, nil
    end
    local w, p, c = match(v, '^(%d+):(%d+):(%d+)$')
    if not w then
      corrupt(key, 'is not a sliding window counter')
    end
    return int(key, w), int(key, p), int(key, c)
  end

  -- The counts a check at now weighs, whether the stored window is its own (2 packed, 1 in an
  -- earlier form, 0 not its own), the stored window index, and where in its window the check is.
  local function counter_now(key, window, now)
    local stored, p, c, packed = counter_state(key, redis_pcall('GET', key))
    local index, elapsed, shift = counter_position(now, window, stored)
    local prev, curr, same = 0, 0, 0
    if stored == index then
      prev, curr, same = p, c, packed and 2 or 1
    elseif stored ~= nil and stored + 1 == index then
      prev = c
    end
    return prev, curr, same, stored, elapsed, shift, index
  end

  -- Adds cost to the window at index, kept (same: its deadline, the end of the next window,
  -- has not moved) or new (prev carried over, curr counted before), the key kept until that
  -- window's successor ends. A packed state of its own window is written over in place
  -- (SETRANGE: its length and deadline stay), which costs Redis less than a SET once the
  -- string is its own (the first SETRANGE after a SET copies it): SET ... KEEPTTL 6,000
  -- instructions, SETRANGE 4,100 (10,000 in a script under callgrind), and no 'OK' made a
  -- Lua table. Redis instructions per decision, uniform / Zipf keys: see the bench's README.
  local function counter_add(key, window, cost, same, index, prev, curr, elapsed, shift)
    local state = struct.pack(PACKED, index, prev, curr + cost)
    if same == 2 then
      redis_call('SETRANGE', key, '0', state)
    elseif same == 1 then
      redis_call('SET', key, state, 'KEEPTTL')
    else
      redis_call('SET', key, state, 'PX', text[shift + 2 * window - elapsed])
    end
  end

  -- Instructions per decision against decide then take, 64 per call on 10,000 keys:
  -- 56,219 -> 47,951.
  local function sliding_window_counter_alone(key, limit, window, burst, now_us, cost, _, _, only_decide)
    local prev, curr, same, stored, elapsed, shift, index = counter_now(key, window, ms_of(now_us))
    local admitted = cost <= limit and prev * (window - elapsed) + (curr + cost) * window <= limit * window
    if admitted and cost > 0 and not only_decide then
      counter_add(key, window, cost, same, index, prev, curr, elapsed, shift)
      local remaining, reset = counter_quota(limit, window, elapsed, shift, prev, curr + cost)
      return 1, remaining, reset, -1
    end
    local remaining, reset = counter_quota(limit, window, elapsed, shift, prev, curr)
    if cost > limit then
      return 0, remaining, reset, NEVER
    elseif not admitted then
      return 0, remaining, reset, shift + counter_retry(limit, window, elapsed, prev, curr, cost)
    end
    return 1, remaining, reset, -1, same, prev, curr, stored
  end

  local function sliding_window_counter(key, limit, window, burst, now_us, cost)
    return sliding_window_counter_alone(key, limit, window, burst, now_us, cost, nil, nil, true)
  end

  local function sliding_window_counter_take(key, limit, window, burst, now_us, cost, same, prev, curr, stored)
    local index, elapsed, shift = counter_position(div(now_us, 1000), window, stored)
    counter_add(key, window, cost, same, index, prev, curr, elapsed, shift)
    return counter_quota(limit, window, elapsed, shift, prev, curr + cost)
  end

  -- Gives back to the window holding at_us, current or (since then) previous; without at_us,
  -- counts cost more in the current window, past the limit (capped so that every weighted
  -- count stays exact in a double).
  local sliding_window_counter_settle = SETTLES and function(key, limit, window, burst, now_us, cost, at_us)
    if not at_us then
      local prev, curr, same, stored = counter_now(key, window, div(now_us, 1000))
      cost = max(min(cost, div(2 ^ 51, window) - curr), 0)
      sliding_window_counter_take(key, limit, window, burst, now_us, cost, same, prev, curr, stored)
      return 1
    end
    local stored, p, c = counter_state(key, redis_pcall('GET', key))
    local index = div(div(at_us, 1000), window)
    if stored == index and c > 0 then
      c = c - min(c, cost)
    elseif stored == index + 1 and p > 0 then
      p = p - min(p, cost)
    else
      return 0
    end
    redis_call('SET', key, struct.pack(PACKED, stored, p, c), 'KEEPTTL')
    return 1
  end
  -- The state at key as the text 'w:p:c', for an inspection.
  local function sliding_window_counter_text(key)
    local w, p, c = counter_state(key, redis_pcall('GET', key))
    return w and text[w] .. ':' .. text[p] .. ':' .. text[c]
  end
  return {
    decide = sliding_window_counter, take = sliding_window_counter_take,
    settle = sliding_window_counter_settle, alone = sliding_window_counter_alone,
    text = sliding_window_counter_text,
  }
end
