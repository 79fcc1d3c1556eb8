#!/usr/bin/env bash
# sqlite3: inserts, an index, joins and aggregates in an in-memory database.
source "$(dirname "$0")/common.sh"
need sqlite3 sqlite3
N=${N:-5000}
cat > "$work/q.sql" <<SQL
CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, v TEXT);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < $N)
INSERT INTO t SELECT x, (x * 7919) % 1000, printf('value %d %d', x, x * x) FROM c;
CREATE INDEX tk ON t(k);
SELECT k, count(*), max(length(v)) FROM t GROUP BY k ORDER BY 2 DESC LIMIT 3;
SELECT count(*) FROM t a JOIN t b ON a.k = b.k WHERE a.id < 500;
SQL
record sqlite3 sqlite3 :memory: ".read $work/q.sql"
