-- keyrate: one token-bucket decision, atomically, inside Redis.
--
-- The same rule as keyrate's in-memory limiter (src/gcra.rs, `decide`): a
-- bucket is one number, `full_at`, the instant in nanoseconds at which it
-- holds `capacity` tokens again. A missing key is the word 0: full at every
-- timestamp. The caller (Rust) has already done every division: it passes
-- the refill a call uses (`spend`) and the refill of a full bucket
-- (`window`), both in whole nanoseconds, so this script only compares,
-- adds and subtracts.
--
-- Redis's Lua numbers are doubles, exact only up to 2^53, and Unix-time
-- nanoseconds are about 1.7e18. Every quantity here is therefore a pair
-- (seconds, nanoseconds) with 0 <= nanoseconds < 1e9; seconds stay below
-- 2^35, so each limb and each sum of limbs is an exact double. The bucket
-- is stored as the exact decimal of `full_at` in nanoseconds, the very word
-- the in-memory limiter keeps.
--
-- KEYS[1]  the bucket key
-- ARGV[1]  now, seconds part, or "time" to read Redis's own clock
-- ARGV[2]  now, nanoseconds part (0 ..= 999999999)
-- ARGV[3]  spend, seconds part; spend 0 only reads (cost 0, remaining)
-- ARGV[4]  spend, nanoseconds part
-- ARGV[5]  window, seconds part
-- ARGV[6]  window, nanoseconds part
-- ARGV[7]  the least TTL a written key gets, in milliseconds
--
-- Returns {admitted (1 or 0), value seconds, value nanoseconds, now seconds,
-- now nanoseconds}: value is the bucket's word after an admission, and the
-- wait until the call would be admitted after a denial. A denial writes
-- nothing.

local NS = 1000000000

local function add(as, an, bs, bn)
  local s, n = as + bs, an + bn
  if n >= NS then
    return s + 1, n - NS
  end
  return s, n
end

-- a - b, for a >= b.
local function sub(as, an, bs, bn)
  local s, n = as - bs, an - bn
  if n < 0 then
    return s - 1, n + NS
  end
  return s, n
end

local function le(as, an, bs, bn)
  return as < bs or (as == bs and an <= bn)
end

local function limb(arg)
  local v = tonumber(arg)
  if v == nil then
    error({err = 'ERR keyrate: bad script argument ' .. tostring(arg)})
  end
  return v
end

local key = KEYS[1]
local now_s, now_n
if ARGV[1] == 'time' then
  -- Redis < 7 replicates scripts verbatim unless told to replicate their
  -- effects, and refuses a write after TIME in that mode. Redis 7 always
  -- replicates effects (this call is then a no-op).
  if redis.replicate_commands then
    redis.replicate_commands()
  end
  local t = redis.call('TIME')
  now_s, now_n = tonumber(t[1]), tonumber(t[2]) * 1000
else
  now_s, now_n = limb(ARGV[1]), limb(ARGV[2])
end
local spend_s, spend_n = limb(ARGV[3]), limb(ARGV[4])
local window_s, window_n = limb(ARGV[5]), limb(ARGV[6])
local min_ttl = limb(ARGV[7])

-- The stored word, split into limbs without ever forming the whole number.
local full_s, full_n = 0, 0
local stored = redis.call('GET', key)
if stored then
  if not string.find(stored, '^%d+$') or #stored > 20 then
    return redis.error_reply('ERR keyrate: bucket key ' .. key .. ' does not hold a keyrate word')
  end
  if #stored > 9 then
    full_s = tonumber(string.sub(stored, 1, #stored - 9))
    full_n = tonumber(string.sub(stored, -9))
  else
    full_n = tonumber(stored)
  end
end

-- Cost 0 (and `remaining`): report the word, change nothing.
if spend_s == 0 and spend_n == 0 then
  return {1, full_s, full_n, now_s, now_n}
end

-- The refill the bucket lacks at `now` after this call: a full bucket
-- lacks nothing, however long it has been full.
local miss_s, miss_n = 0, 0
if not le(full_s, full_n, now_s, now_n) then
  miss_s, miss_n = sub(full_s, full_n, now_s, now_n)
end
miss_s, miss_n = add(miss_s, miss_n, spend_s, spend_n)

if not le(miss_s, miss_n, window_s, window_n) then
  local wait_s, wait_n = sub(miss_s, miss_n, window_s, window_n)
  return {0, wait_s, wait_n, now_s, now_n}
end

local new_s, new_n = add(now_s, now_n, miss_s, miss_n)
local word
if new_s == 0 then
  word = string.format('%d', new_n)
else
  word = string.format('%d%09d', new_s, new_n)
end

-- The key lives until the bucket is full again (rounded up to the
-- millisecond): then it is indistinguishable from a missing key. An
-- admission never brings an existing key's expiry closer (which only a
-- caller whose clock runs ahead of the others' could ask for).
local ttl = miss_s * 1000 + math.ceil(miss_n / 1000000)
if ttl < min_ttl then
  ttl = min_ttl
end
if stored then
  local old = redis.call('PTTL', key)
  if old > ttl then
    ttl = old
  end
end
if ttl < 1 then
  ttl = 1
end
redis.call('SET', key, word, 'PX', string.format('%d', ttl))
return {1, new_s, new_n, now_s, now_n}
