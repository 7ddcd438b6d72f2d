-- Entry inspecting one policy's key, writing nothing: one request of one policy (see
-- protocol.lua), whose cost is what to decide for; with an override in force (its key given,
-- OVERRIDES), the key and numbers it names are inspected instead. Reply: allowed (1/0),
-- remaining and reset (ms) now, retry (ms), the key's PTTL (ms; -2 when absent), its state as
-- field, value pairs (a string's as 'value'), the limit in force, the key inspected, 1 when an
-- override's numbers were in force (else 0), the window in force (ms), and the time of the
-- inspection (ms; a short anchored window's head is read against it).
local sets, a = read_sets(ARGV)
local cost = read_request(ARGV, a)
local p = sets[1][1]
local key, limit, window, burst = policy_keys(p, KEYS, 1)
local now_us = clock(ARGV[1])
local allowed, remaining, reset, retry = p.decide(key, limit, window, burst, now_us, cost)
-- A grouped policy's record is read as its own key would be (groups.lua).
local call = p.call
local kind = call('TYPE', key)['ok']
local state = {}
if kind == 'hash' then
  state = call('HGETALL', key)
elseif kind == 'string' then
  -- Named by the client, which knows the algorithm (GCRA's time, or a fixed window's numbers);
  -- as text where an algorithm packs it (its text).
  state = { 'value', p.text and p.text(key) or call('GET', key) }
elseif kind == 'zset' then
  state = { 'entries', str(call('ZCARD', key)) }
end
local overridden = 0
if (key ~= KEYS[1] and not p.group) or limit ~= p.limit or window ~= p.window or burst ~= p.burst then
  overridden = 1
end
-- A grouped policy's key is its group's.
local read = p.group and KEYS[1] or key
return { allowed, remaining, reset, retry, call('PTTL', key), state, limit, read, overridden, window, div(now_us, 1000) }
