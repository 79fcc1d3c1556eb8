<?php
// PHP: an array of 1.5 M string keys, each an array of an integer and a
// string, sorted by key and read back in order; prints a deterministic
// digest (579 MB peak, ~2.5 s natively here).
//
// usage: php -d memory_limit=-1 hash-records.php [N]   (N keys; default 1,500,000)
$h = [];
$n = (int)($argv[1] ?? 1500000);
for ($i = 0; $i < $n; $i++) {
    $h["key$i"] = [$i, str_repeat("v", $i % 50)];
}
ksort($h);
$s = 0;
foreach ($h as $k => $v) {
    $s = ($s * 31 + strlen($k) + $v[0]) % 1000000007;
}
echo "$s ", count($h), "\n";
