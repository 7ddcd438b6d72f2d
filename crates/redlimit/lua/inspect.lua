-- Entry for inspecting one policy's key, writing nothing. KEYS[1]: its key; KEYS[2], when
-- given, the client's override key (see overridden): with an override in force, the key and
-- numbers it names are inspected instead. ARGV: as one.lua, the cost being what to decide for.
-- Reply: allowed (1/0), remaining and reset (ms) now, retry (ms), the key's PTTL (ms; -2 when
-- absent), its state as field, value pairs, the limit in force, and the key inspected.
local cost = tonumber(ARGV[2])
local tag, overridable, _, m = policy_tag(ARGV[3])
local key, limit, window, burst = KEYS[1], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if overridable and KEYS[2] then
  key, limit, window, burst = m.overridden(KEYS[2], key, limit, window, burst)
end
local decide = algorithm(tag)
local allowed, remaining, reset, retry = decide(key, limit, window, burst, clock(), cost)
local kind = redis.call('TYPE', key)['ok']
local state = {}
if kind == 'hash' then
  state = redis.call('HGETALL', key)
elseif kind == 'string' then
  state = { 'tat', redis.call('GET', key) }
elseif kind == 'zset' then
  state = { 'entries', str(redis.call('ZCARD', key)) }
end
return { allowed, remaining, reset, retry, redis.call('PTTL', key), state, limit, key }
