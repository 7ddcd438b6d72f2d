-- An algorithm's decide and take by its tag; a chain of comparisons, so a check builds no table.
local function algorithm(tag)
  if tag == 'fw' then
    return fixed_window, fixed_window_take
  elseif tag == 'fwa' then
    return fixed_window_anchored, fixed_window_take
  elseif tag == 'swl' then
    return sliding_window_log, sliding_window_log_take
  elseif tag == 'swc' then
    return sliding_window_counter, sliding_window_counter_take
  elseif tag == 'tb' then
    return token_bucket, token_bucket_take
  elseif tag == 'gcra' then
    return gcra, gcra_take
  end
  error({ err = 'ERR redlimit: unknown algorithm tag ' .. tostring(tag) })
end
