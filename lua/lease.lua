-- A concurrency limit's leases: a sorted set per client of lease ids scored by their expiry
-- (ms), decided and taken as a member of a check (the request's LEASE flag) after its policies,
-- so a request refused by either consumes from neither.

-- Reclaims the expired leases of the set at key at now_ms, then: allowed (1/0), the free slots
-- before a take, and when refused the wait (ms) until the earliest lease expires (-1 when
-- allowed).
local function lease_decide(key, limit, now_ms)
  redis_call('ZREMRANGEBYSCORE', key, '-inf', now_ms)
  local held = redis_call('ZCARD', key)
  if held < limit then
    return 1, limit - held, -1
  end
  local earliest = tonumber(redis_call('ZRANGE', key, 0, 0, 'WITHSCORES')[2]) - now_ms
  return 0, 0, max(earliest, 0)
end

-- Holds lease id in the set at key until now_ms + ttl. Every lease lives ttl: the newest one
-- decides when the whole set may go.
local function lease_take(key, ttl, id, now_ms)
  redis_call('ZADD', key, now_ms + ttl, id)
  redis_call('PEXPIRE', key, ttl)
end
