module plimsoll/clients/go/sandbox

go 1.19
