# Ruby: a hash of 1.2 M string keys, each an array of an integer and a
# string, then the keys sorted and read back in order; prints a
# deterministic digest (330 MB peak, ~3 s natively here).
#
# usage: ruby hash-records.rb [N]   (N keys; default 1,200,000)
h = {}
(ARGV[0] || 1_200_000).to_i.times { |i| h["key#{i}"] = [i, "v" * (i % 40)] }
s = 0
h.keys.sort.each { |k| s = (s * 31 + k.size + h[k][0]) % 1_000_000_007 }
puts "#{s} #{h.size}"
