package awsfn

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
)

// AWSSecrets reads secrets by ARN: arn:…:secretsmanager:… via GetSecretValue (string or
// binary value), arn:…:ssm:…:parameter/… via GetParameter with decryption (SecureString).
type AWSSecrets struct {
	Config aws.Config
}

// Secret returns the value of the secret or parameter arn; an empty value is an error.
func (s AWSSecrets) Secret(ctx context.Context, arn string) (string, error) {
	parts := strings.SplitN(arn, ":", 6)
	if len(parts) < 6 {
		return "", fmt.Errorf("%q is not an ARN", arn)
	}
	var v string
	switch parts[2] {
	case "secretsmanager":
		out, err := secretsmanager.NewFromConfig(s.Config).GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String(arn)})
		if err != nil {
			return "", fmt.Errorf("secretsmanager:GetSecretValue: %w", err)
		}
		if out.SecretString != nil {
			v = *out.SecretString
		} else {
			v = string(out.SecretBinary)
		}
	case "ssm":
		out, err := ssm.NewFromConfig(s.Config).GetParameter(ctx, &ssm.GetParameterInput{Name: aws.String(arn), WithDecryption: aws.Bool(true)})
		if err != nil {
			return "", fmt.Errorf("ssm:GetParameter: %w", err)
		}
		if out.Parameter != nil && out.Parameter.Value != nil {
			v = *out.Parameter.Value
		}
	default:
		return "", fmt.Errorf("%q: want a Secrets Manager secret or an SSM parameter ARN", arn)
	}
	if v == "" {
		return "", errors.New("the secret is empty")
	}
	return v, nil
}
