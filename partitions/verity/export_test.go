package verity

// What the tests of kept trees (package verity_test, which assemble disks)
// look at.
var (
	KeyOf          = treeKey
	KeyReadsAtMost = int64(keyReadsAtMost)
)

const KeptTempPrefix = keptTempPrefix
