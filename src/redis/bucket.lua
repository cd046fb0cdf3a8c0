-- keyrate: one token-bucket decision, atomically, inside Redis.
--
-- The rule is keyrate's (src/gcra.rs, `decide`): a bucket is one number,
-- `full_at`, the instant in nanoseconds at which it holds `capacity` tokens
-- again; a missing key is the word 0, full at every timestamp. Rust has done
-- every division: it passes the refill this call uses (`spend`) and the
-- slack `window - spend`, so that the call is admitted exactly when
-- `full_at <= now + slack`, and the new word is `max(full_at, now) + spend`.
-- The script returns the word it read; Rust then runs `gcra::decide` on it
-- for the answer (tokens left, retry-after), and checks that both agree.
--
-- Redis's Lua numbers are doubles, exact only up to 2^53, and Unix-time
-- nanoseconds are about 1.7e18, so every quantity is a pair (seconds,
-- nanoseconds), 0 <= nanoseconds < 1e9, seconds below 2^35: each limb and
-- each sum of limbs is an exact double. The key holds the exact decimal of
-- `full_at`. This script is written for few string operations and few
-- Redis calls: they, not the arithmetic, are its cost.
--
-- KEYS[1]  the bucket key
-- ARGV[1]  now, seconds part, or "time" to read Redis's own clock
-- ARGV[2]  now, nanoseconds part
-- ARGV[3]  spend, seconds part; spend 0 only reads (cost 0, remaining)
-- ARGV[4]  spend, nanoseconds part
-- ARGV[5]  slack (window - spend), seconds part
-- ARGV[6]  slack, nanoseconds part
-- ARGV[7]  the least TTL a written key gets, in milliseconds (at least 1
--          from this version of Rust; earlier ones sent 0)
--
-- Rust may add its guess of the stored word (from its mirror, or '' for a
-- missing key) and what to write if it is right:
-- ARGV[8]  the word Rust expects ('' for a missing key)
-- ARGV[9]  the new word
-- ARGV[10] with the caller's time, the new word's TTL in milliseconds (the
--          floor and the 1 ms minimum applied); at Redis's clock, the new
--          word rounded up to the millisecond, for PXAT
-- At Redis's clock, also, in microseconds of Unix time (TIME's
-- resolution, so each is exact and below 2^53 in a double):
-- ARGV[11] the least instant at which the call is admitted
-- ARGV[12] the last instant at which the bucket is not yet full
-- ARGV[13] the last instant at which ARGV[10] is not below the floor
--          (-1 if none)
-- With the caller's time, ARGV[9] is `gcra::decide` on the expected word:
-- when the key holds exactly ARGV[8], the script writes ARGV[9] with no
-- arithmetic and no conversion at all (the fast path). At Redis's clock
-- (Redis 7 only), ARGV[9] is the expected word plus the spend: the new
-- word whenever the call is admitted and the bucket is not full at Redis's
-- instant (the expected word is after it), which hold exactly when the
-- instant is within [ARGV[11], ARGV[12]]; the script compares, and writes
-- with no other arithmetic. Otherwise it decides below.
--
-- Expiry, with no read of the old TTL. With the caller's time the key
-- gets `PX` = new word - now (rounded up to the ms, at least the floor and
-- 1 ms): Redis counts it from when the script runs, after the caller took
-- its timestamp, so the key outlives the word on the caller's timeline.
-- At Redis's clock (`TIME`, Unix time, Redis's own clock for expiry too)
-- the key expires at the absolute instant `PXAT` = the new word rounded up
-- to the ms (later if the floor says so), which only moves forward as the
-- word does: exact, and never brought closer.
--
-- Returns {admitted (1 or 0), the word read ('' for a missing key), now
-- seconds, now nanoseconds}; from the fast path, where the word read is
-- ARGV[8], which Rust sent, the integer 1 with the caller's time (an
-- integer reply costs Redis less than an array: about 0.6 us a call on
-- Redis 7.0, docs/redis.md) and TIME's own reply {seconds, microseconds}
-- at Redis's clock. A denial writes nothing.

local key = KEYS[1]
local stored = redis.call('GET', key)
if not stored then
  stored = ''
end

local server = ARGV[1] == 'time'
-- Redis's instant, once read.
local t
if stored == ARGV[8] then
  if not server then
    redis.call('SET', key, ARGV[9], 'PX', ARGV[10])
    return 1
  end
  if redis.REDIS_VERSION_NUM then
    t = redis.call('TIME')
    local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    if now_us >= tonumber(ARGV[11]) and now_us <= tonumber(ARGV[12]) then
      if now_us <= tonumber(ARGV[13]) then
        redis.call('SET', key, ARGV[9], 'PXAT', ARGV[10])
      else
        -- The floor is later: the least TTL from Redis's millisecond
        -- (as PXAT at the floor, or later by the time the script took).
        redis.call('SET', key, ARGV[9], 'PX', ARGV[7])
      end
      return t
    end
  end
end

-- The general path: the library functions it calls more than once, read
-- from the globals once (each global read is a table lookup per call).
local tonumber, sub, find, format, call = tonumber, string.sub, string.find, string.format, redis.call

if server and not t then
  -- Redis < 7 replicates scripts verbatim unless told to replicate their
  -- effects, and refuses a write after TIME in that mode. Redis 7 (which
  -- has REDIS_VERSION_NUM) always replicates effects.
  if not redis.REDIS_VERSION_NUM then
    redis.replicate_commands()
  end
  t = call('TIME')
end
local now_s, now_n
if server then
  now_s, now_n = tonumber(t[1]), tonumber(t[2]) * 1000
else
  now_s, now_n = tonumber(ARGV[1]), tonumber(ARGV[2])
end

-- The word, split into limbs without ever forming the whole number. A
-- value that is not one is caught below before anything is written, and by
-- Rust on every path.
local len = #stored
local full_s, full_n = 0, 0
if len > 9 then
  full_s, full_n = tonumber(sub(stored, 1, len - 9)), tonumber(sub(stored, len - 8))
elseif len > 0 then
  full_n = tonumber(stored)
end
if not (full_s and full_n) then
  return redis.error_reply('ERR keyrate: a bucket key does not hold a keyrate word')
end

local spend_s, spend_n = tonumber(ARGV[3]), tonumber(ARGV[4])
if spend_s == 0 and spend_n == 0 then
  return {1, stored, now_s, now_n}
end

-- Admitted exactly when full_at <= now + slack.
local lim_s, lim_n = now_s + tonumber(ARGV[5]), now_n + tonumber(ARGV[6])
if lim_n >= 1000000000 then
  lim_s, lim_n = lim_s + 1, lim_n - 1000000000
end
if full_s > lim_s or (full_s == lim_s and full_n > lim_n) then
  return {0, stored, now_s, now_n}
end
if len > 20 or find(stored, '%D') then
  return redis.error_reply('ERR keyrate: a bucket key does not hold a keyrate word')
end

-- The new word: max(full_at, now) + spend.
local new_s, new_n = now_s + spend_s, now_n + spend_n
if full_s > now_s or (full_s == now_s and full_n > now_n) then
  new_s, new_n = full_s + spend_s, full_n + spend_n
end
if new_n >= 1000000000 then
  new_s, new_n = new_s + 1, new_n - 1000000000
end
local word
if new_s == 0 then
  word = format('%d', new_n)
else
  word = format('%d%09d', new_s, new_n)
end

-- The key lives until the bucket is full again (rounded up to the
-- millisecond, at least the floor and 1 ms): then it is indistinguishable
-- from a missing key.
local min_ttl = tonumber(ARGV[7])
if min_ttl < 1 then
  min_ttl = 1
end
if server and redis.REDIS_VERSION_NUM then
  -- Redis 7: at the instant the word names, on the clock that expires it.
  local at = new_s * 1000 + math.ceil(new_n / 1000000)
  local floor = now_s * 1000 + math.floor(now_n / 1000000) + min_ttl
  if at < floor then
    at = floor
  end
  call('SET', key, word, 'PXAT', at)
else
  local ttl = (new_s - now_s) * 1000 + math.ceil((new_n - now_n) / 1000000)
  if ttl < min_ttl then
    ttl = min_ttl
  end
  call('SET', key, word, 'PX', ttl)
end
return {1, stored, now_s, now_n}
