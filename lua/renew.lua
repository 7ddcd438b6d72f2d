-- Entry renewing a concurrency lease. KEYS[1]: the lease set. ARGV: now (see clock), unused (0),
-- the lease TTL (ms), the lease id. Reply: { 1 } when the lease was still held and now lives
-- ttl more, { 0 } when it had expired (its slot may be someone else's).
local key, ttl, id = KEYS[1], tonumber(ARGV[3]), ARGV[4]
local now = div(clock(ARGV[1]), 1000)
local expiry = redis_call('ZSCORE', key, id)
if not expiry or tonumber(expiry) <= now then
  return { 0 }
end
redis_call('ZADD', key, now + ttl, id)
redis_call('PEXPIRE', key, ttl)
return { 1 }
