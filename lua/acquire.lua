-- Entry for a concurrency lease. KEYS[1]: the client's lease set (a sorted set of lease ids
-- scored by their expiry in ms). ARGV: now (see clock), the limit, the lease TTL (ms), the lease
-- id. Expired leases are reclaimed first. Reply: acquired (1/0), free slots after, and when
-- denied the wait (ms) until the earliest lease expires (-1 when acquired).
local key, limit, ttl, id = KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local now = div(clock(ARGV[1]), 1000)
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local held = redis.call('ZCARD', key)
if held < limit then
  redis.call('ZADD', key, now + ttl, id)
  -- Every lease lives ttl: the newest one decides when the whole set may go.
  redis.call('PEXPIRE', key, ttl)
  return { 1, limit - held - 1, -1 }
end
local earliest = tonumber(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2]) - now
return { 0, 0, max(earliest, 0) }
