-- The end of the function library's body (see Library in scripts.rs), before its entries: its
-- functions are made once and outlive a call, so what they keep for one call only is forgotten
-- at the start of the next.
local function fresh_call()
  server_time = false
  for _, fresh in ipairs({ made, made_grouped }) do
    for _, fns in pairs(fresh) do
      if fns.fresh then
        fns.fresh()
      end
    end
  end
  forget_groups()
end
