-- An algorithm's decide, take, settle, alone (its check of one policy decided and taken in
-- one) and, where it has one, untake (fw: alone given back), by its name, made at the call's
-- first policy of it:
-- a call that checks one algorithm makes no other's functions (a check of two fixed windows
-- through this script: 29.1 -> 27.0 us per call, median of 5 runs of `redis-benchmark -P 8
-- EVALSHA`, against making every algorithm's at every call).
local made = {}
local function algorithm(name)
  local fns = made[name]
  if fns then
    return fns[1], fns[2], fns[3], fns[4], fns[5]
  end
  local decide, take, settle, alone, untake
  if name == 'fw' or name == 'fwa' then
    local aligned, anchored, take_aligned, take_anchored, settle_aligned, settle_anchored, alone_anchored
    aligned, anchored, take_aligned, take_anchored, settle_aligned, settle_anchored, alone, untake,
      alone_anchored = fixed_window_functions()
    decide, take, settle = aligned, take_aligned, settle_aligned
    if name == 'fwa' then
      decide, take, settle, alone, untake = anchored, take_anchored, settle_anchored, alone_anchored, nil
    end
  elseif name == 'swl' then
    decide, take, settle, alone = sliding_window_log_functions()
  elseif name == 'swc' then
    decide, take, settle, alone = sliding_window_counter_functions()
  elseif name == 'tb' then
    decide, take, settle, alone = token_bucket_functions()
  elseif name == 'gcra' then
    decide, take, settle, alone = gcra_functions()
  else
    error({ err = 'ERR redlimit: unknown algorithm ' .. tostring(name) })
  end
  made[name] = { decide, take, settle, alone, untake }
  return decide, take, settle, alone, untake
end
