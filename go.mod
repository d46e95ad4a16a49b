module xmix

go 1.26.8
