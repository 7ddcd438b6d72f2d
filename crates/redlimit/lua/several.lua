-- Entry for several policies, all under one hash tag. KEYS: one key per policy. ARGV: now (see
-- clock), cost (0 peeks), then four per policy: algorithm tag, limit, window (ms), burst.
-- Reply: four integers per policy, as one.lua. Nothing is consumed unless every policy admits;
-- then each one's reply is its quota after the check, otherwise before it.
local ALGORITHMS = {
  fw = { fixed_window, fixed_window_take },
  fwa = { fixed_window_anchored, fixed_window_take },
  swl = { sliding_window_log, sliding_window_log_take },
  swc = { sliding_window_counter, sliding_window_counter_take },
  tb = { token_bucket, token_bucket_take },
  gcra = { gcra, gcra_take },
}
local cost = tonumber(ARGV[2])
local now_us = clock()
local reply, kept, admitted = {}, {}, true
for i = 1, #KEYS do
  local at = 2 + (i - 1) * 4
  local limit, window, burst = tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4])
  local allowed, remaining, reset, retry, a, b, c =
    ALGORITHMS[ARGV[at + 1]][1](KEYS[i], limit, window, burst, now_us, cost)
  reply[#reply + 1] = allowed
  reply[#reply + 1] = remaining
  reply[#reply + 1] = reset
  reply[#reply + 1] = retry
  kept[i] = { limit, window, burst, a, b, c }
  if allowed == 0 then
    admitted = false
  end
end
if admitted and cost > 0 then
  for i = 1, #KEYS do
    local k = kept[i]
    reply[4 * i - 2], reply[4 * i - 1] =
      ALGORITHMS[ARGV[4 * i - 1]][2](KEYS[i], k[1], k[2], k[3], now_us, cost, k[4], k[5], k[6])
  end
end
return reply
