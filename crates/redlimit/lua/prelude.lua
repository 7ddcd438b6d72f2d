-- redlimit: helpers shared by every algorithm. The scripts are concatenated in this order:
-- prelude.lua, one file per algorithm, check.lua (the entry point).
--
-- All arithmetic is on integers below 2^53, where Lua's doubles are exact. Numbers are formatted
-- with %d before they reach redis.call, because Lua's own number-to-string conversion keeps only
-- 14 significant digits.

local ALGORITHMS = {}
local NEVER = -2

-- Corrupt state is an error, never a decision.
local function corrupt(key, why)
  error({ err = 'REDLIMIT_CORRUPT ' .. key .. ' ' .. why })
end

-- A command that may meet a key of the wrong type.
local function call(key, ...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err then
    corrupt(key, 'has the wrong type: ' .. reply.err)
  end
  return reply
end

-- A stored non-negative integer; nil when absent.
local function int(key, value)
  if value == nil or value == false then
    return nil
  end
  if type(value) ~= 'string' or #value > 16 or not string.match(value, '^%d+$') then
    corrupt(key, 'holds a non-integer value')
  end
  return tonumber(value)
end

-- The fields of a hash as integers: all present, or all nil when the key is absent.
local function fields(key, ...)
  local reply = call(key, 'HMGET', key, ...)
  local values, present = {}, 0
  for i = 1, select('#', ...) do
    values[i] = int(key, reply[i])
    if values[i] ~= nil then
      present = present + 1
    end
  end
  if present ~= 0 and present ~= #reply then
    corrupt(key, 'is missing a field')
  end
  return values
end

local function str(n)
  return string.format('%d', n)
end

-- floor(a / b) for integers, corrected in case the double division rounded across an integer.
local function div(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function ceil_div(a, b)
  return div(a + b - 1, b)
end

-- A plan is { before = {remaining, reset_ms}, after = {…} or nil, denial = ms or NEVER or nil,
-- write = function() end }: nothing is written until every policy of the check admits.
local function view(remaining, reset_ms)
  return { math.max(remaining, 0), reset_ms }
end
