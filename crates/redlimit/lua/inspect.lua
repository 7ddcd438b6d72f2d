-- Entry for inspecting one policy's key, writing nothing. KEYS[1]: its key. ARGV: as one.lua,
-- the cost being what to decide for. Reply: allowed (1/0), remaining and reset (ms) now, retry
-- (ms), the key's PTTL (ms; -2 when absent), and its state as field, value pairs.
local key, cost = KEYS[1], tonumber(ARGV[2])
local decide = algorithm(policy_tag(ARGV[3]))
local allowed, remaining, reset, retry =
  decide(key, tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), clock(), cost)
local kind = redis.call('TYPE', key)['ok']
local state = {}
if kind == 'hash' then
  state = redis.call('HGETALL', key)
elseif kind == 'string' then
  state = { 'tat', redis.call('GET', key) }
elseif kind == 'zset' then
  state = { 'entries', str(redis.call('ZCARD', key)) }
end
return { allowed, remaining, reset, retry, redis.call('PTTL', key), state }
