module tai-agent

go 1.27
