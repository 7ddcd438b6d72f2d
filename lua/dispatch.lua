-- An algorithm's functions by its name, as a table (decide, take, settle, alone: its check of
-- one policy decided and taken in one, and, where it has one, untake: its alone given back),
-- made at the call's first policy of it:
-- a call that checks one algorithm makes no other's functions (a check of two fixed windows
-- through this script: 29.1 -> 27.0 us per call, median of 5 runs of `redis-benchmark -P 8
-- EVALSHA`, against making every algorithm's at every call).
local made = {}
local function algorithm(name)
  local fns = made[name]
  if fns then
    return fns
  end
  if name == 'fw' or name == 'fwa' then
    made.fw, made.fwa = fixed_window_functions()
  elseif name == 'swl' then
    made.swl = sliding_window_log_functions()
  elseif name == 'swc' then
    made.swc = sliding_window_counter_functions()
  elseif name == 'tb' then
    made.tb = token_bucket_functions()
  elseif name == 'gcra' then
    made.gcra = gcra_functions()
  else
    error({ err = 'ERR redlimit: unknown algorithm ' .. tostring(name) })
  end
  return made[name]
end
