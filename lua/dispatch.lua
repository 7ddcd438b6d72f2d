-- An algorithm's functions by its name, as a table (decide, take, settle, alone: its check of
-- one policy decided and taken in one, and, where it has one, untake: its alone given back),
-- made at the call's first policy of it:
-- a call that checks one algorithm makes no other's functions (a check of two fixed windows
-- through this script: 29.1 -> 27.0 us per call, median of 5 runs of `redis-benchmark -P 8
-- EVALSHA`, against making every algorithm's at every call).
local made, made_grouped = {}, {}
-- grouped: the functions of a policy of a key group, over its records (groups.lua).
local function algorithm(name, grouped)
  local made = grouped and made_grouped or made
  local fns = made[name]
  if fns then
    return fns
  end
  local call, pcall_call = nil, nil
  if grouped then
    call, pcall_call = vcall, vpcall
  end
  if name == 'fw' or name == 'fwa' then
    made.fw, made.fwa = fixed_window_functions(call, pcall_call)
  elseif name == 'tb' then
    made.tb = token_bucket_functions(call)
  elseif name == 'gcra' then
    made.gcra = gcra_functions(call)
  elseif grouped then
    error({ err = 'ERR redlimit: no key group holds algorithm ' .. tostring(name) })
  elseif name == 'swl' then
    made.swl = sliding_window_log_functions()
  elseif name == 'swc' then
    made.swc = sliding_window_counter_functions()
  else
    error({ err = 'ERR redlimit: unknown algorithm ' .. tostring(name) })
  end
  return made[name]
end

-- Writes what the algorithms of keys of their own kept to the call's end (pair_writes in the
-- prelude): the last state of each key the call wrote.
local function flush_writes()
  for _, fns in pairs(made) do
    if fns.flush then
      fns.flush()
    end
  end
end
