-- Entry for any requests of any policies, decided in order at one time (see protocol.lua for
-- the arguments). Reply, packed (see packed in prelude.lua), per request: four integers per policy (as one.lua's; a ban's denial
-- replies allowed = 2), then the numbers in force of each policy that takes overrides (its
-- limit, window (ms) and burst: the policy's, or the client's override's), then for a
-- reservation the time it was taken at (us; 0 for a retry), then for a grant (GRANT) how much
-- it took beyond its cost, then for a request with a lease
-- (LEASE) its concurrency limit's answer: granted (1/0), free slots after, the wait (ms) until
-- a lease expires when refused (-1 when granted). A request consumes nothing unless every one
-- of its policies admits and its lease is granted; then each one's reply is its quota after the
-- request, otherwise before it. The lease's answer is not remembered with the rest: a retry of
-- a request id takes a lease of its own, since it runs again while holding it. A banned client
-- is denied until its ban ends, and every denial by a policy that bans counts towards a ban.

local sets, first = read_sets(ARGV)
-- done: the length of out once its last whole reply was written.
local done = 0
-- The request of several policies being decided (by decide_alone, or decide_group's way where
-- runs), for a failure at one of its policies to give back what those before it took
-- (give_back_taken): its set, where its keys begin, its time and cost. A few assignments a
-- request, where a log of each take cost a call per policy: Redis instructions per fixed window
-- and GCRA decision (`redlimit-bench --mode instructions --decisions 100000 --only
-- fixed_window+gcra`), uniform / Zipf keys, 41,918 / 38,683 before -> 41,379 / 39,197.
local taking_set, taking_k, taking_now_us, taking_cost, taking_runs = nil, 0, nil, 0, false

-- Decides a request of cost > 0 of several policies that each have an untake (fixed windows,
-- GCRA, token buckets) at now_us, its replies in out after base, its keys from KEYS[k]: each
-- policy decides and takes at once; a denial decides the policies after it without taking and
-- gives back what the ones before it took, each of those then replying its quota before the
-- request, as decide would have. Returns where the next request's keys begin. Script time per decision, batches
-- of 64 checks of a fixed window and a per-hour one on 10,000 keys, against decide then take:
-- 19.34 -> 11.88 us best, 21.99 -> 12.67 median of 7 runs of `redis-benchmark -P 8 EVALSHA`.
local function decide_alone(set, out, base, k, now_us, cost)
  local admitted, taken, first = true, 0, k
  taking_set, taking_k, taking_now_us, taking_cost, taking_runs = set, k, now_us, cost, false
  for i = 1, #set do
    local p, key = set[i], KEYS[k]
    if p.group then
      key = virtual(key, p.group, p.kind)
    end
    k = k + 1
    local allowed, remaining, reset, retry
    if admitted then
      allowed, remaining, reset, retry = p.alone(key, p.limit, p.window, p.burst, now_us, cost, nil, p.slack)
      if allowed == 1 then
        taken = i
      else
        admitted = false
      end
    else
      allowed, remaining, reset, retry = p.decide(key, p.limit, p.window, p.burst, now_us, cost, p.slack)
    end
    local r = base + 4 * i
    out[r - 3], out[r - 2], out[r - 1], out[r] = allowed, remaining, reset, retry
  end
  if not admitted then
    for i = 1, taken do
      local p, r, key = set[i], base + 4 * i, KEYS[first + i - 1]
      if p.group then
        key = virtual(key, p.group, p.kind)
      end
      out[r - 2], out[r - 1] = p.untake(key, p.limit, p.window, p.burst, now_us, cost)
    end
  end
  taking_set = nil
  return k
end

-- Gives back what the policies of the request being decided (taking_set) took before the one
-- whose failure stopped the call: read from their answers in out, each written as it took (by
-- decide_runs before its later policies decide). decide_alone takes up to its first denial; by
-- decide_group's way only policies of keys of their own take before the request is decided.
local function give_back_taken(out)
  local set = taking_set
  taking_set = nil
  for i = 1, set and #set or 0 do
    local p, key, allowed = set[i], KEYS[taking_k + i - 1], out[done + 4 * i - 3]
    if not taking_runs and allowed ~= 1 then
      break
    elseif allowed == 1 and not (taking_runs and p.group) then
      if p.group then
        key = virtual(key, p.group, p.kind)
      end
      p.untake(key, p.limit, p.window, p.burst, taking_now_us, taking_cost)
    end
  end
end

-- Decides a request of a set with key groups (set.runs) as decide_alone does: on the groups'
-- records' numbers where it can (groups.lua), else by decide_alone.
local function decide_grouped(set, out, base, k, now_us, cost)
  taking_set, taking_k, taking_now_us, taking_cost, taking_runs = set, k, now_us, cost, true
  local next_k = decide_group(set, out, base, k, now_us, cost, KEYS)
  if next_k then
    taking_set = nil
    return next_k
  end
  return decide_alone(set, out, base, k, now_us, cost)
end

-- Appends the answer of lease to out: allowed (as lease_decide's) and the free slots after a
-- request admitted by every other member, whose lease is then taken, and the wait.
local function write_lease(out, key, lease, now_us, allowed, free, wait, admitted)
  if admitted and allowed == 1 then
    lease_take(key, lease.ttl, lease.id, div(now_us, 1000))
    free = free - 1
  end
  local n = #out
  out[n + 1], out[n + 2], out[n + 3] = allowed, free, wait
end

-- Writes a request's remembered reply (stored, at its request id's key idem) into out, its
-- policies' keys from KEYS[k] skipped. Returns where the next request's keys begin.
local function replay(out, stored, set, reserve, idem, k)
  local overridable, _ = 0, nil
  for i = 1, #set do
    local p = set[i]
    _, _, _, _, _, _, k = policy_keys(p, KEYS, k, true)
    if p.overrides then
      overridable = overridable + 1
    end
  end
  local head, tail = 4 * #set, reserve and 1 or 0
  if #stored == head + 3 * overridable + tail then
    for i = 1, #stored do
      out[#out + 1] = stored[i]
    end
    return k
  end
  -- A reply of another shape would misalign every later request's in a batch; but for one
  -- remembered before a reply carried the window and burst in force (an overridable policy's
  -- limit alone), read with the policy's.
  if overridable == 0 or #stored ~= head + overridable + tail then
    corrupt(idem, 'holds the reply of another request')
  end
  for i = 1, head do
    out[#out + 1] = stored[i]
  end
  local at = head
  for i = 1, #set do
    local p = set[i]
    if p.overrides then
      local n = #out
      at = at + 1
      out[n + 1], out[n + 2], out[n + 3] = stored[at], p.window, p.burst
    end
  end
  for i = at + 1, #stored do
    out[#out + 1] = stored[i]
  end
  return k
end

-- A grant's part of an admitted request of cost (its policies decided into out after base,
-- what each one's take needs in kept): up to grant more, as much as every policy has room
-- for, decided again at the larger cost with kept rewritten for it. Returns how much more
-- than cost the takes then take.
local function grant_more(set, out, base, kept, now_us, cost, grant)
  local extra = grant
  for i = 1, #set do
    extra = min(extra, out[base + 4 * i - 2])
  end
  if extra <= 0 then
    return 0
  end
  -- A grant is taken once per many decisions: a table of its own costs nothing that shows.
  local again = {}
  for i = 1, #set do
    local j = 9 * i
    local allowed, remaining, reset, retry, b, c, d, e = set[i].decide(kept[j - 7], kept[j - 6], kept[j - 5], kept[j - 4], now_us, cost + extra, nil)
    if allowed ~= 1 then
      return 0
    end
    again[i] = { remaining, reset, retry, b, c, d, e }
  end
  for i = 1, #set do
    local j, r, d = 9 * i, base + 4 * i, again[i]
    out[r - 2], out[r - 1], out[r] = d[1], d[2], d[3]
    kept[j - 3], kept[j - 2], kept[j - 1], kept[j] = d[4], d[5], d[6], d[7]
  end
  return extra
end

-- Decides a request of set (cost, a reservation, its request id's key idem remembered for
-- once_window ms, up to grant more than cost where every policy has room) at now_us, writing its
-- reply into out after what is there; its keys from KEYS[k], kept as decide_requests says.
-- Returns where the next request's keys begin. Its own
-- function, so the loop over requests reads at a glance: a call per request costs a fixed
-- window and a per-hour one 2% more instructions (replay under callgrind: 35,746 -> 36,540).
local function decide_request(out, kept, set, k, now_us, cost, reserve, idem, once_window, lease, grant)
  -- This request's reply starts after base; limits: the numbers in force (limit, window,
  -- burst) of each policy that takes overrides, made at the first. A lease is decided after
  -- every policy and before any takes.
  local base, admitted, limits, lone = #out, true, nil, #set == 1 and not lease and not grant
  local lease_key, leased, free, wait, extra, strikes = nil, nil, nil, nil, 0, nil
  if set.runs and cost > 0 and not lease and not grant then
    k = decide_grouped(set, out, base, k, now_us, cost)
  elseif set.alone and cost > 0 and not lease and not grant then
    k = decide_alone(set, out, base, k, now_us, cost)
  else
    for i = 1, #set do
      local p = set[i]
      local key, limit, window, burst, skey, bkey
      key, limit, window, burst, skey, bkey, k = policy_keys(p, KEYS, k)
      if p.overrides then
        limits = limits or {}
        limits[#limits + 1], limits[#limits + 2], limits[#limits + 3] = limit, window, burst
      end
      local ban = p.ban
      local allowed, remaining, reset, retry, b, c, d, e
      local left = nil
      if ban then
        left = marks_of().banned(bkey, div(now_us, 1000))
      end
      if left then
        allowed, remaining, reset, retry = 2, 0, left, left
      else
        allowed, remaining, reset, retry, b, c, d, e = p.decide(key, limit, window, burst, now_us, cost, p.slack)
        if allowed == 0 and ban and retry ~= NEVER then
          -- Struck once every policy has decided, so that a request a later policy's corrupt
          -- state stops strikes nothing, and its retry once repaired strikes once.
          strikes = strikes or {}
          local n = #strikes
          strikes[n + 1], strikes[n + 2], strikes[n + 3] = i, skey, bkey
        end
      end
      if allowed ~= 1 then
        admitted = false
      elseif cost > 0 and lone then
        -- Nothing else to wait for: take at once, keeping nothing.
        remaining, reset = p.take(key, limit, window, burst, now_us, cost, b, c, d, e)
      else
        local j = 9 * i
        kept[j - 8], kept[j - 7], kept[j - 6], kept[j - 5], kept[j - 4] = p.take, key, limit, window, burst
        kept[j - 3], kept[j - 2], kept[j - 1], kept[j] = b, c, d, e
      end
      local r = base + 4 * i
      out[r - 3], out[r - 2], out[r - 1], out[r] = allowed, remaining, reset, retry
    end
    if lease then
      lease_key = KEYS[k]
      k = k + 1
      leased, free, wait = lease_decide(lease_key, lease.limit, div(now_us, 1000))
      admitted = admitted and leased == 1
    end
    -- After everything that may stop the request (a later policy's corrupt state, its lease
    -- set's, a later count of denials), so that a request stopped strikes nothing.
    for j = 4, strikes and #strikes or 0, 3 do
      int(strikes[j + 1], redis_call('GET', strikes[j + 1]))
    end
    for j = 1, strikes and #strikes or 0, 3 do
      local i = strikes[j]
      local length = marks_of().strike(strikes[j + 1], strikes[j + 2], set[i].ban, div(now_us, 1000))
      if length then
        local r = base + 4 * i
        out[r - 3], out[r - 1], out[r] = 2, max(out[r - 1], length), length
      end
    end
    if admitted and grant then
      extra = grant_more(set, out, base, kept, now_us, cost, grant)
    end
    if admitted and cost + extra > 0 and not lone then
      for i = 1, #set do
        local j = 9 * i
        out[base + 4 * i - 2], out[base + 4 * i - 1] = kept[j - 8](kept[j - 7], kept[j - 6], kept[j - 5], kept[j - 4], now_us, cost + extra, kept[j - 3], kept[j - 2], kept[j - 1], kept[j])
      end
    end
  end
  for i = 1, limits and #limits or 0 do
    out[#out + 1] = limits[i]
  end
  if reserve then
    out[#out + 1] = 0
  end
  -- A request its lease refused is not remembered: its retry, once a slot is free, must take
  -- what its policies would have.
  if idem and (not lease or leased == 1) then
    remember(idem, out, base + 1, #out, once_window)
  end
  if reserve then
    out[#out] = now_us
  end
  if grant then
    out[#out + 1] = extra
  end
  if lease then
    write_lease(out, lease_key, lease, now_us, leased, free, wait, admitted and cost > 0)
  end
  return k
end

-- Decides the requests from ARGV[a] on, writing each one's reply into out in place; kept: what
-- each policy's take needs, nine values per policy, reused by every request of several policies
-- (no table per request or policy); a lone policy takes as soon as it admits.
local function decide_requests(out, kept, a)
  local now_us, k, last, _ = nil, 1, #ARGV, nil
  while a <= last do
    -- A request without flags of one policy without overrides or bans: decided with no
    -- bookkeeping. Script time per decision in batches of 64 (fixed window 5.59 -> 5.14 us,
    -- GCRA 6.06 -> 5.59, best of 5 runs of `redis-benchmark -P 8 EVALSHA` on the test
    -- script's arguments, uniform keys). An algorithm with an alone (fw: INCRBY first) decides
    -- and takes in one: fixed window 5.25 -> 3.58 us best, 7.46 -> 5.87 median of 7 such runs,
    -- 10,000 keys (the anchored window, unchanged, 5.54 -> 5.73 beside it). A run of them
    -- (REPEAT) is read once.
    local head, cost_text = ARGV[a + 1], ARGV[a]
    local h = known_numbers[head] or number(head)
    local set, repeats, after = sets[h / SET_STEP], 1, a + 2
    if not set and h % SET_STEP == REPEAT then
      set, repeats, after = sets[(h - REPEAT) / SET_STEP], number(ARGV[a + 2]), a + 3
    end
    local cost = set and (known_numbers[cost_text] or number(cost_text))
    if set and set.plain then
      local p = set[1]
      local alone, limit, window, burst, slack = p.alone, p.limit, p.window, p.burst, p.slack
      a = after
      now_us = now_us or clock(ARGV[1])
      for _ = 1, repeats do
        local allowed, remaining, reset, retry = alone(KEYS[k], limit, window, burst, now_us, cost, cost_text, slack)
        k = k + 1
        out[done + 1], out[done + 2], out[done + 3], out[done + 4] = allowed, remaining, reset, retry
        done = done + 4
      end
    elseif set and (set.alone or set.runs) and cost > 0 then
      -- Several policies that each take at once, without flags: no bookkeeping either.
      a = after
      now_us = now_us or clock(ARGV[1])
      local step, decide = 4 * #set, set.runs and decide_grouped or decide_alone
      for _ = 1, repeats do
        k = decide(set, out, done, k, now_us, cost, KEYS)
        done = done + step
      end
    else
      local reserve, once_window, lease, grant
      cost, set, reserve, once_window, _, a, repeats, lease, _, grant = read_request(ARGV, a)
      set = sets[set]
      for _ = 1, repeats do
        local idem, stored
        if once_window then
          idem = KEYS[k]
          k = k + 1
          stored = seen_before(idem)
        end
        if stored then
          k = replay(out, stored, set, reserve, idem, k)
          if lease then
            -- A retry runs again: its lease is its own, taken if the request was admitted.
            local admitted = cost > 0
            for i = 1, #set do
              admitted = admitted and stored[4 * i - 3] == 1
            end
            now_us = now_us or clock(ARGV[1])
            local allowed, free, wait = lease_decide(KEYS[k], lease.limit, div(now_us, 1000))
            write_lease(out, KEYS[k], lease, now_us, allowed, free, wait, admitted)
            k = k + 1
          end
        else
          now_us = now_us or clock(ARGV[1])
          k = decide_request(out, kept, set, k, now_us, cost, reserve, idem, once_window, lease, grant)
        end
        done = #out
      end
    end
  end
end

-- Redis keeps a script's writes when it fails, so a batch that stops at a request (its state
-- corrupt) answers the requests decided before it, whose writes stand, and no more: the client
-- sends that request and the rest again, and none is counted twice. What the failed request's
-- policies before the failing one took is given back (give_back_taken), and what the call kept
-- to its end is written either way, the failed request's share of it given back too. One pcall
-- per call.
local out = {}
local ok, err = pcall(decide_requests, out, {}, first)
if not ok then
  pcall(give_back_taken, out)
  for i = #out, done + 1, -1 do
    out[i] = nil
  end
end
flush_writes()
flush_groups()
if not ok and done == 0 then
  raise(err)
end
return packed(out)
