-- An algorithm's decide, take and refund by its name; a chain of comparisons, so a check builds
-- no table.
local function algorithm(name)
  if name == 'fw' then
    return fixed_window, fixed_window_take, fixed_window_refund
  elseif name == 'fwa' then
    return fixed_window_anchored, fixed_window_take, fixed_window_refund
  elseif name == 'swl' then
    return sliding_window_log, sliding_window_log_take, sliding_window_log_refund
  elseif name == 'swc' then
    return sliding_window_counter, sliding_window_counter_take, sliding_window_counter_refund
  elseif name == 'tb' then
    return token_bucket, token_bucket_take, token_bucket_refund
  elseif name == 'gcra' then
    return gcra, gcra_take, gcra_refund
  end
  error({ err = 'ERR redlimit: unknown algorithm ' .. tostring(name) })
end
