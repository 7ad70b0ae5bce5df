module hostile

go 1.27
