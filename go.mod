module github.com/sandkeep/sandkeep

go 1.26
