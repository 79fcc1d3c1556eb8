-- sqlite3: an in-memory table of 600 k rows with text keys, an index
-- built over it, then an ordered scan and grouped aggregates; prints
-- deterministic results (about 140 MB peak, a few seconds natively).
--
-- usage: sqlite3 :memory: ".read sqlite-index.sql"
PRAGMA cache_size = -1000000;
CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, g INTEGER, v TEXT);
WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 600000)
INSERT INTO t SELECT i, printf('key-%08d', (i * 7919) % 600011), i % 1000,
                     printf('%.*c', 40 + i % 60, 'x') FROM c;
CREATE INDEX tk ON t(k);
SELECT count(*), sum(length(v)), min(k), max(k) FROM t;
SELECT sum(length(k) + g) FROM (SELECT k, g FROM t ORDER BY k LIMIT 300000 OFFSET 150000);
SELECT g, count(*), sum(length(v)) FROM t GROUP BY g ORDER BY 3 DESC LIMIT 3;
