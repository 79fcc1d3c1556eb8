;; Guile: a hash table of 800 k string keys, each a list of an integer and
;; a string, then folded in table order; prints the count and a
;; deterministic digest. Guile's Boehm collector marks the whole heap in
;; no order, from the main thread and a marker thread (254 MB peak, ~2.3 s
;; natively here).
;;
;; usage: guile --no-auto-compile hash-records.scm
(define h (make-hash-table))
(let loop ((i 0))
  (when (< i 800000)
    (hash-set! h (string-append "k" (number->string i)) (list i (make-string (modulo i 30) #\x)))
    (loop (+ i 1))))
(define s 0)
(hash-for-each (lambda (k v) (set! s (modulo (+ (* s 31) (string-length k) (car v)) 1000000007))) h)
(display (hash-count (const #t) h)) (display " ") (display s) (newline)
