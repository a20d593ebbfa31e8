module ember

go 1.19
