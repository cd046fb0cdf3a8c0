-- keyrate: one compound decision, atomically, inside Redis: every quota
-- of every scope of a call admits its cost, and then all are spent, or
-- none is and nothing is written.
--
-- The rule is keyrate's (src/gcra.rs `decide`, src/compound/decide.rs),
-- word by word, as in bucket.lua: a bucket word is `full_at`, the instant
-- in nanoseconds at which that quota's bucket is full again (0: full at
-- every instant); Rust passes, per quota, the refill this call uses
-- (`spend`) and the slack `window - spend`, so that the quota admits the
-- call exactly when `full_at <= now + slack`, and its new word is
-- `max(full_at, now) + spend`. Rust then decides again on the words the
-- script returns (src/compound/decide.rs) for the answer (the least
-- remaining, the exact wait, which quota binds), and checks that both
-- agree. Quantities are (seconds, nanoseconds) pairs, exact in Lua's
-- doubles (see bucket.lua).
--
-- A scope's key holds its words as decimals joined by ',' ("w0,w1,w2"):
-- word i is quota i of the scope's policy. A key with one word is a
-- single-quota bucket (bucket.lua's format). A missing key is all 0, and
-- a missing word 0; words past the policy's quotas are kept as they are.
--
-- KEYS[i]  the bucket key of scope i (all in one hash slot on a cluster)
-- ARGV[1]  now, seconds part, or "time" to read Redis's own clock
-- ARGV[2]  now, nanoseconds part
-- ARGV[3]  the least TTL a written key gets, in milliseconds
-- ARGV[4]  1 to decide and spend; 0 only to read (cost 0, remaining)
-- then, for each scope in KEYS order: its number of quotas n, then for
-- each quota: slack seconds, slack nanoseconds, spend seconds, spend
-- nanoseconds.
--
-- Each written key expires when its last word is reached (as bucket.lua:
-- PX from now with the caller's time, PXAT at Redis's clock on Redis 7),
-- when it is indistinguishable from a missing key.
--
-- Returns {admitted (1 or 0), now seconds, now nanoseconds, the value
-- read from each key ('' for a missing one)}. A denial writes nothing.

local server = ARGV[1] == 'time'
local now_s, now_n
if server then
  if not redis.REDIS_VERSION_NUM then
    redis.replicate_commands()
  end
  local t = redis.call('TIME')
  now_s, now_n = tonumber(t[1]), tonumber(t[2]) * 1000
else
  now_s, now_n = tonumber(ARGV[1]), tonumber(ARGV[2])
end

-- Every key's words, checked before anything is written.
local stored, words = {}, {}
for i = 1, #KEYS do
  local value = redis.call('GET', KEYS[i]) or ''
  stored[i] = value
  local w = {}
  if value ~= '' then
    for part in string.gmatch(value .. ',', '([^,]*),') do
      local len = #part
      if len == 0 or len > 20 or #w == 8 or string.find(part, '%D') then
        return redis.error_reply('ERR keyrate: a bucket key does not hold keyrate words')
      end
      if len > 9 then
        w[#w + 1] = {tonumber(string.sub(part, 1, len - 9)), tonumber(string.sub(part, len - 8))}
      else
        w[#w + 1] = {0, tonumber(part)}
      end
    end
  end
  words[i] = w
end

local reply = {1, now_s, now_n}
for i = 1, #KEYS do
  reply[i + 3] = stored[i]
end
if ARGV[4] ~= '1' then
  return reply
end

-- Decide every quota; the new words, kept until all admit.
local new = {}
local arg = 5
for i = 1, #KEYS do
  local w, nw = words[i], {}
  local n = tonumber(ARGV[arg])
  arg = arg + 1
  for q = 1, n do
    local f = w[q] or {0, 0}
    local lim_s, lim_n = now_s + tonumber(ARGV[arg]), now_n + tonumber(ARGV[arg + 1])
    if lim_n >= 1000000000 then
      lim_s, lim_n = lim_s + 1, lim_n - 1000000000
    end
    if f[1] > lim_s or (f[1] == lim_s and f[2] > lim_n) then
      reply[1] = 0
      return reply
    end
    local s, ns = now_s, now_n
    if f[1] > now_s or (f[1] == now_s and f[2] > now_n) then
      s, ns = f[1], f[2]
    end
    s, ns = s + tonumber(ARGV[arg + 2]), ns + tonumber(ARGV[arg + 3])
    if ns >= 1000000000 then
      s, ns = s + 1, ns - 1000000000
    end
    nw[q] = {s, ns}
    arg = arg + 4
  end
  -- Words past the policy's quotas stay as they are.
  for q = n + 1, #w do
    nw[q] = w[q]
  end
  new[i] = nw
end

local min_ttl = tonumber(ARGV[3])
if min_ttl < 1 then
  min_ttl = 1
end
for i = 1, #KEYS do
  local parts, last_s, last_n = {}, 0, 0
  for q, word in ipairs(new[i]) do
    if word[1] == 0 then
      parts[q] = string.format('%d', word[2])
    else
      parts[q] = string.format('%d%09d', word[1], word[2])
    end
    if word[1] > last_s or (word[1] == last_s and word[2] > last_n) then
      last_s, last_n = word[1], word[2]
    end
  end
  local value = table.concat(parts, ',')
  if server and redis.REDIS_VERSION_NUM then
    local at = last_s * 1000 + math.ceil(last_n / 1000000)
    local floor = now_s * 1000 + math.floor(now_n / 1000000) + min_ttl
    if at < floor then
      at = floor
    end
    redis.call('SET', KEYS[i], value, 'PXAT', at)
  else
    local ttl = (last_s - now_s) * 1000 + math.ceil((last_n - now_n) / 1000000)
    if ttl < min_ttl then
      ttl = min_ttl
    end
    redis.call('SET', KEYS[i], value, 'PX', ttl)
  end
end
return reply
